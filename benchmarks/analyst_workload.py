"""What a realistic analyst asks of the sample hospital schema, and which of it dpsql answers:
`python -m benchmarks.analyst_workload [--out benchmarks/results/analyst_workload.md]`.

The questions are the ones a health-services analyst would type on first meeting visits, patients, departments and
regions (counts and averages by group, joins to the patient and lookup tables, per-patient summaries, CTEs,
filters through subqueries, medians), and those of issue 36 (anti-joins, CTEs of public and private tables joined,
joins as written, DISTINCT sums, date parts, subtotals), over `labs` and `staff` too (benchmarks/support.py's
write_hospital). Each is run once through a session on a copy of that data; the table says whether it was
answered, at what cost, or the refusal's first line. Nothing here is a test: it is the list
the issue notes track from session to session.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.support import write_hospital
from dpsql.errors import Error
from dpsql.policy import load_policy
from dpsql.session import PrivateSession

QUESTIONS = [
    ("visits per department", "SELECT department, COUNT(*) FROM visits GROUP BY department"),
    ("average cost by region and sex", "SELECT region, sex, AVG(cost) FROM visits GROUP BY region, sex"),
    ("patients seen", "SELECT COUNT(DISTINCT patient_id) FROM visits"),
    ("smokers' stay", "SELECT smoker, AVG(length_of_stay), STDDEV(length_of_stay) FROM visits GROUP BY smoker"),
    ("visits by month", "SELECT date_trunc('month', visit_date) AS month, COUNT(*) FROM visits GROUP BY month"),
    ("share of costly visits", "SELECT AVG(CASE WHEN cost > 1000 THEN 1 ELSE 0 END) FROM visits"),
    ("FILTER", "SELECT COUNT(*) FILTER (WHERE smoker), COUNT(*) FROM visits"),
    ("GROUP BY ALL", "SELECT region, COUNT(*) FROM visits GROUP BY ALL"),
    ("CTE", "WITH adults AS (SELECT * FROM visits WHERE age >= 18) SELECT region, COUNT(*) FROM adults "
            "GROUP BY region"),
    ("subquery in FROM", "SELECT band, COUNT(*) FROM (SELECT CASE WHEN age < 40 THEN 'young' ELSE 'older' END "
                         "AS band FROM visits) AS v GROUP BY band"),
    ("join to departments", "SELECT d.specialty_group, COUNT(*), AVG(v.cost) FROM visits v JOIN departments d "
                            "ON v.department = d.department GROUP BY d.specialty_group"),
    ("join to regions", "SELECT r.urban, AVG(v.cost) FROM visits v JOIN regions r ON v.region = r.region "
                        "GROUP BY r.urban"),
    ("join to patients", "SELECT p.insurance, COUNT(*) FROM visits v JOIN patients p "
                         "ON v.patient_id = p.patient_id GROUP BY p.insurance"),
    ("patients by insurance", "SELECT insurance, COUNT(*), AVG(chronic_conditions) FROM patients "
                              "GROUP BY insurance"),
    ("visits per patient histogram", "SELECT n, COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits "
                                     "GROUP BY patient_id) AS p GROUP BY n"),
    ("average spend per patient", "SELECT AVG(spend) FROM (SELECT patient_id, SUM(cost) AS spend FROM visits "
                                  "GROUP BY patient_id) AS p"),
    ("per-patient spend by insurance", "SELECT q.insurance, AVG(p.spend) FROM (SELECT patient_id, SUM(cost) AS "
                                       "spend FROM visits GROUP BY patient_id) AS p JOIN patients q "
                                       "ON p.patient_id = q.patient_id GROUP BY q.insurance"),
    ("public lookup", "SELECT * FROM departments ORDER BY floor"),
    ("IN over a public table", "SELECT COUNT(*) FROM visits WHERE department IN (SELECT department FROM "
                               "departments WHERE specialty_group = 'surgical')"),
    ("IN over patients (on the unit)", "SELECT COUNT(*) FROM visits WHERE patient_id IN (SELECT patient_id FROM "
                                       "patients WHERE chronic_conditions > 3)"),
    ("EXISTS", "SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM patients p WHERE p.patient_id = "
               "v.patient_id AND p.sex = 'F')"),
    ("median cost", "SELECT MEDIAN(cost) FROM visits"),
    ("90th percentile of cost", "SELECT department, QUANTILE_CONT(cost, 0.9) FROM visits GROUP BY department"),
    ("max stay", "SELECT MAX(length_of_stay) FROM visits"),
    ("distinct departments per region", "SELECT region, COUNT(DISTINCT department) FROM visits GROUP BY region"),
    ("list of regions seen", "SELECT DISTINCT region FROM visits"),
    ("top departments", "SELECT department, COUNT(*) AS n FROM visits GROUP BY department ORDER BY n DESC LIMIT 3"),
    ("HAVING", "SELECT department, AVG(cost) FROM visits GROUP BY department HAVING COUNT(*) > 100"),
    # issue 36: the forms a held-out corpus found refused (labs: a second private table of the patient; staff: a
    # public table with several rows per department)
    ("patients without a later lab", "SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM labs l "
                                     "WHERE l.patient_id = v.patient_id AND l.lab_date > v.visit_date)"),
    ("EXISTS under OR", "SELECT COUNT(*) FROM visits v WHERE v.age > 80 OR EXISTS (SELECT 1 FROM labs l "
                        "WHERE l.patient_id = v.patient_id AND l.value > 150)"),
    ("NOT IN on the patient", "SELECT region, COUNT(*) FROM visits WHERE patient_id NOT IN (SELECT patient_id "
                              "FROM patients WHERE chronic_conditions > 3) GROUP BY region"),
    ("latest visit per patient", "SELECT department, COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM visits w "
                                 "WHERE w.patient_id = v.patient_id AND w.visit_date > v.visit_date) "
                                 "GROUP BY department"),
    ("CTE of a public table joined", "WITH big AS (SELECT department FROM departments WHERE beds > 20) "
                                     "SELECT COUNT(*), AVG(v.cost) FROM visits v JOIN big ON v.department = "
                                     "big.department"),
    ("CTE of patients joined", "WITH older AS (SELECT patient_id, insurance FROM patients WHERE birth_year < 1960) "
                               "SELECT o.insurance, COUNT(*) FROM visits v JOIN older o ON v.patient_id = "
                               "o.patient_id GROUP BY o.insurance"),
    ("scalar subquery of a public table", "SELECT COUNT(*) FROM visits WHERE length_of_stay > (SELECT AVG(floor) "
                                          "FROM departments)"),
    ("RIGHT JOIN", "SELECT d.specialty_group, COUNT(*) FROM departments d RIGHT JOIN visits v "
                   "ON v.department = d.department GROUP BY d.specialty_group"),
    ("comma join", "SELECT p.insurance, AVG(v.cost) FROM visits v, patients p WHERE v.patient_id = p.patient_id "
                   "GROUP BY p.insurance"),
    ("constant in ON", "SELECT COUNT(*) FROM visits v JOIN staff s ON s.department = v.department "
                       "AND s.role = 'nurse'"),
    ("SUM and AVG of distinct values", "SELECT region, SUM(DISTINCT length_of_stay), AVG(DISTINCT age) FROM visits "
                                       "GROUP BY region"),
    ("distinct patients with a filter", "SELECT department, COUNT(DISTINCT patient_id) FILTER (WHERE age > 65) "
                                        "FROM visits GROUP BY department"),
    ("distinct departments per patient", "SELECT AVG(depts) FROM (SELECT patient_id, COUNT(DISTINCT department) AS "
                                         "depts FROM visits GROUP BY patient_id) AS p"),
    ("year and month", "SELECT AVG(YEAR(visit_date)), MEDIAN(MONTH(visit_date)) FROM visits"),
    ("subtotals (ROLLUP)", "SELECT region, sex, COUNT(*), GROUPING(region, sex) AS level FROM visits "
                           "GROUP BY ROLLUP (region, sex)"),
    ("CUBE", "SELECT sex, smoker, AVG(cost) FROM visits GROUP BY CUBE (sex, smoker)"),
    ("window function", "SELECT department, COUNT(*), RANK() OVER (ORDER BY COUNT(*)) FROM visits "
                        "GROUP BY department"),
    ("one patient's rows", "SELECT * FROM visits WHERE patient_id = 17"),
]


def run(folder: Path) -> list[tuple[str, str, str]]:
    policy = load_policy(write_hospital(folder))  # the sample data, with labs and staff
    session = PrivateSession(policy, "analyst")
    outcomes = []
    try:
        for label, sql in QUESTIONS:
            try:
                result = session.execute(sql, epsilon=0.5)
                outcomes.append((label, "answered", f"epsilon {float(result.cost.epsilon):g}, "
                                                    f"{len(result.rows)} row(s)"))
            except Error as exc:
                outcomes.append((label, "refused", str(exc).splitlines()[0][:160]))
    finally:
        session.close()
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the table as Markdown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        outcomes = run(Path(scratch))
    answered = sum(1 for _, state, _ in outcomes if state == "answered")
    lines = [f"{answered}/{len(outcomes)} answered", "", "| question | | cost or reason |", "|---|---|---|"]
    lines += [f"| {label} | {state} | {detail.replace('|', '/')} |" for label, state, detail in outcomes]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
