// Run by tests/server/test_jdbc.py: `java -cp postgresql.jar DateProbe.java PORT PASSWORD`. Binds a date column's
// parameter in every way a JDBC program does, on server-prepared statements (prepareThreshold=-1: each is
// described before it is bound), and prints "OK <setter>" or "ERR <setter> <SQLSTATE>" for each.
import java.sql.*;
import java.time.*;

public class DateProbe {
    interface Setter { void set(PreparedStatement p) throws SQLException; }

    static void run(Connection c, String label, String column, Setter setter) {
        String sql = "SELECT COUNT(*) FROM visits WHERE " + column + " = ?";
        try (PreparedStatement p = c.prepareStatement(sql)) {
            setter.set(p);
            try (ResultSet r = p.executeQuery()) {
                r.next();
                r.getLong(1);
                System.out.println("OK " + label);
            }
        } catch (SQLException refused) {
            System.out.println("ERR " + label + " " + refused.getSQLState());
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/dpsql?sslmode=disable&prepareThreshold=-1";
        try (Connection c = DriverManager.getConnection(url, "alice", args[1])) {
            try (Statement s = c.createStatement()) {
                s.execute("SET dpsql.epsilon = 0.01");
            }
            run(c, "setDate", "visit_date", p -> p.setDate(1, java.sql.Date.valueOf("2024-01-01")));
            run(c, "setTimestamp", "visit_date", p -> p.setTimestamp(1, Timestamp.valueOf("2024-01-02 00:00:00")));
            run(c, "setTimestampWithTime", "visit_date",
                p -> p.setTimestamp(1, Timestamp.valueOf("2024-01-03 10:00:00")));
            run(c, "setObjectLocalDate", "visit_date", p -> p.setObject(1, LocalDate.of(2024, 1, 4)));
            run(c, "setObjectLocalDateTime", "visit_date", p -> p.setObject(1, LocalDateTime.of(2024, 1, 5, 0, 0)));
            run(c, "setObjectOffsetDateTime", "visit_date",
                p -> p.setObject(1, OffsetDateTime.of(2024, 1, 6, 0, 0, 0, 0, ZoneOffset.UTC)));
            run(c, "setString", "visit_date", p -> p.setString(1, "2024-01-07"));
            run(c, "setTime", "visit_date", p -> p.setTime(1, Time.valueOf("10:00:00")));
            run(c, "setBytes", "region", p -> p.setBytes(1, "north".getBytes()));
        }
    }
}
