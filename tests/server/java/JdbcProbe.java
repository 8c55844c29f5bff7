// Run by tests/server/test_jdbc.py with Java's source launcher: `java -cp postgresql.jar JdbcProbe.java PORT PASSWORD`.
// Prints one line per fact the test checks: what DBeaver and Metabase do through the PostgreSQL JDBC driver, in
// the order they do it (connect, DatabaseMetaData for the sync, a native query with a date parameter).
import java.sql.*;

public class JdbcProbe {
    interface Metadata { ResultSet get() throws SQLException; }

    // One line per row: the label, then the named columns' values; or the label, FAILED and the SQLSTATE.
    static void rows(String label, Metadata call, String... columns) {
        try (ResultSet r = call.get()) {
            int count = 0;
            while (r.next()) {
                StringBuilder line = new StringBuilder(label);
                for (String column : columns) line.append(' ').append(r.getString(column));
                System.out.println(line);
                count++;
            }
            System.out.println(label + " count " + count);
        } catch (SQLException e) {
            System.out.println(label + " FAILED " + e.getSQLState() + " " + e.getMessage());
        }
    }

    static void query(Connection c, String label, String sql) {
        try (Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
            int columns = r.getMetaData().getColumnCount();
            while (r.next()) {
                StringBuilder line = new StringBuilder(label);
                for (int i = 1; i <= columns; i++) line.append(' ').append(r.getString(i));
                System.out.println(line);
            }
        } catch (SQLException e) {
            System.out.println(label + " FAILED " + e.getSQLState() + " " + e.getMessage());
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/visits?sslmode=disable";
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
            rows("catalog", meta::getCatalogs, "TABLE_CAT");
            rows("schema", meta::getSchemas, "TABLE_SCHEM");
            rows("table", () -> meta.getTables(null, null, "%", new String[] {"TABLE", "VIEW"}), "TABLE_SCHEM",
                 "TABLE_NAME");
            rows("column", () -> meta.getColumns(null, "public", "visits", "%"), "COLUMN_NAME", "DATA_TYPE",
                 "IS_NULLABLE");
            rows("primary", () -> meta.getPrimaryKeys(null, "public", "visits"), "COLUMN_NAME");
            rows("imported", () -> meta.getImportedKeys(null, "public", "visits"), "FKCOLUMN_NAME");
            rows("exported", () -> meta.getExportedKeys(null, "public", "visits"), "PKCOLUMN_NAME");
            rows("index", () -> meta.getIndexInfo(null, "public", "visits", false, true), "INDEX_NAME");
            rows("privilege", () -> meta.getTablePrivileges(null, "public", "visits"), "GRANTEE", "PRIVILEGE");
            rows("type", meta::getTypeInfo, "TYPE_NAME");
            // Metabase's sync: the schemas with the database's name, each table's privileges (reserved words as
            // aliases, as Metabase writes them), the tables with their descriptions and row estimates.
            query(c, "metabase-schema", "SELECT nspname AS \"TABLE_SCHEM\", current_database() AS \"TABLE_CATALOG\" "
                  + "FROM pg_catalog.pg_namespace WHERE nspname <> 'pg_toast' AND (nspname !~ '^pg_temp_' "
                  + "OR nspname = (pg_catalog.current_schemas(true))[1]) ORDER BY 1");
            query(c, "metabase-privilege", "WITH privileges AS (SELECT t.schemaname AS schema, t.tablename AS table, "
                  + "pg_catalog.has_table_privilege(current_user, '\"' || t.schemaname || '\".\"' || t.tablename "
                  + "|| '\"', 'select') AS select, pg_catalog.has_table_privilege(current_user, '\"' "
                  + "|| t.schemaname || '\".\"' || t.tablename || '\"', 'update') AS update "
                  + "FROM pg_catalog.pg_tables t WHERE t.schemaname !~ '^pg_') "
                  + "SELECT p.* FROM privileges p WHERE p.select OR p.update ORDER BY 2");
            query(c, "metabase-table", "SELECT n.nspname AS \"schema\", c.relname AS \"name\", "
                  + "d.description IS NOT NULL AS described, s.n_live_tup AS estimated_row_count "
                  + "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON c.relnamespace = n.oid "
                  + "LEFT JOIN pg_catalog.pg_description d ON c.oid = d.objoid AND d.objsubid = 0 "
                  + "AND d.classoid = 'pg_class'::regclass LEFT JOIN pg_stat_user_tables s "
                  + "ON n.nspname = s.schemaname AND c.relname = s.relname "
                  + "WHERE n.nspname IN ('public') AND c.relkind IN ('r', 'p', 'v') ORDER BY 2");
            // A native question with a date parameter (Metabase's field filter on a date).
            String dated = "SELECT sex, COUNT(*) AS n FROM visits WHERE visit_date >= ? GROUP BY sex ORDER BY sex";
            try (PreparedStatement p = c.prepareStatement(dated)) {
                p.setDate(1, java.sql.Date.valueOf("2020-01-01"));
                try (ResultSet r = p.executeQuery()) {
                    while (r.next()) System.out.println("dated " + r.getString(1) + " " + r.getLong(2));
                }
            } catch (SQLException e) {
                System.out.println("dated FAILED " + e.getSQLState() + " " + e.getMessage());
            }
            // DBeaver's and Metabase's row counts of a question: its rows counted by an outer query.
            query(c, "wrapped", "SELECT COUNT(*) FROM (SELECT department, COUNT(*) AS n FROM visits "
                  + "GROUP BY department) AS source");
        }
    }
}
