// Run by tests/server/test_jdbc.py with Java's source launcher: `java -cp postgresql.jar JdbcProbe.java PORT PASSWORD`.
// Prints one line per fact the test checks: what DBeaver and other JDBC tools do first.
import java.sql.*;

public class JdbcProbe {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/dpsql?sslmode=disable";
        try (Connection c = DriverManager.getConnection(url, "alice", args[1])) {
            String sql = "SELECT region, COUNT(*) AS n FROM visits WHERE age > ? GROUP BY region ORDER BY region";
            try (PreparedStatement p = c.prepareStatement(sql)) {
                p.setInt(1, 30);
                ResultSetMetaData described = p.getMetaData();
                System.out.println("describe " + described.getColumnName(2) + " " + described.getColumnTypeName(2));
                try (ResultSet r = p.executeQuery()) {
                    while (r.next()) System.out.println("row " + r.getString(1) + " " + r.getLong(2));
                }
            }
            try (Statement s = c.createStatement()) {
                s.executeQuery("SELECT age FROM visits");
            } catch (SQLException refused) {
                System.out.println("refused " + refused.getSQLState());
            }
            DatabaseMetaData meta = c.getMetaData();
            System.out.println("product " + meta.getDatabaseProductName());
            try (ResultSet r = meta.getTables(null, null, "%", new String[] {"TABLE"})) {
                while (r.next()) System.out.println("table " + r.getString("TABLE_SCHEM") + "." + r.getString("TABLE_NAME"));
            }
            try (ResultSet r = meta.getColumns(null, null, "visits", "%")) {
                while (r.next()) System.out.println("column " + r.getString("COLUMN_NAME") + " " + r.getInt("DATA_TYPE")
                                                   + " " + r.getString("IS_NULLABLE"));
            }
            try (ResultSet r = meta.getSchemas()) {
                while (r.next()) System.out.println("schema " + r.getString(1));
            }
        }
    }
}
