"""Generate the synthetic `visits` table: hospital visits, several per patient. Deterministic for a seed.

    python sample_data/generate_visits.py                          # the shipped sample_data/visits.csv (and the
                                                                   # patients, departments and regions beside it)
    python sample_data/generate_visits.py --patients 400000 --out /tmp/visits_1m.parquet   # ~1M rows

Each patient has 1 to --max-visits visits (more visits are rarer), a region, an age, a sex and a smoking status;
each visit a date, a department, a cost (log-normal by department, about 1% missing) and a length of stay. Nothing
here is real. The seeded generator is for making data only; dpsql's noise never uses it.

Beside visits it writes `patients.csv` (private: one row per patient of visits, with the same sex and a birth year
matching the age, and an insurance and a number of chronic conditions drawn from a second generator, so that
visits.csv stays what it was), and the public lookup tables `departments.csv` and `regions.csv`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import duckdb
import numpy as np

REGIONS = ["north", "south", "east", "west", "central"]
DEPARTMENTS = ["cardiology", "dermatology", "emergency", "general", "neurology", "oncology", "orthopedics",
               "pediatrics"]
_DEPARTMENT_COST = np.array([900.0, 150.0, 600.0, 120.0, 700.0, 1800.0, 800.0, 200.0])  # median cost
_DEPARTMENT_STAY = np.array([1.5, 0.0, 0.8, 0.0, 1.2, 3.0, 1.0, 0.2])  # mean nights


def generate(patients: int, max_visits: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Visits per patient: a geometric distribution truncated to 1..max_visits.
    weights = 0.55 ** np.arange(max_visits)
    visits = rng.choice(np.arange(1, max_visits + 1), size=patients, p=weights / weights.sum())
    patient_id = np.repeat(np.arange(1, patients + 1), visits)
    rows = patient_id.size
    region = rng.choice(len(REGIONS), size=patients, p=[0.24, 0.22, 0.2, 0.18, 0.16])[patient_id - 1]
    age = np.clip(rng.normal(48, 20, size=patients).round(), 0, 99).astype(np.int64)[patient_id - 1]
    sex = rng.choice(np.array(["F", "M"]), size=patients)[patient_id - 1]
    smoker = (rng.random(patients) < 0.18)[patient_id - 1]
    department = rng.integers(0, len(DEPARTMENTS), size=rows)
    department = np.where(age < 16, 7, department)  # children go to pediatrics
    cost = np.round(_DEPARTMENT_COST[department] * rng.lognormal(0.0, 0.6, size=rows) * (1 + smoker * 0.2), 2)
    cost_missing = rng.random(rows) < 0.01
    stay = np.minimum(rng.poisson(_DEPARTMENT_STAY[department] * (1 + age / 100)), 45).astype(np.int64)
    days = rng.integers(0, 731, size=rows)
    return {
        "patient_id": patient_id.astype(np.int64),
        "visit_day": days.astype(np.int64),  # becomes visit_date when written
        "region": np.array(REGIONS, dtype=object)[region],
        "department": np.array(DEPARTMENTS, dtype=object)[department],
        "age": age,
        "sex": sex.astype(object),
        "smoker": smoker,
        "cost": np.where(cost_missing, np.nan, cost),
        "length_of_stay": stay,
    }


# The public lookup tables: (department, floor, beds, specialty_group) and (region, population, urban).
DEPARTMENT_ROWS = [("cardiology", 3, 40, "medical"), ("dermatology", 1, 10, "medical"),
                   ("emergency", 0, 30, "emergency"), ("general", 1, 60, "medical"), ("neurology", 4, 25, "medical"),
                   ("oncology", 5, 45, "medical"), ("orthopedics", 2, 35, "surgical"),
                   ("pediatrics", 2, 30, "medical")]
REGION_ROWS = [("north", 820_000, False), ("south", 1_240_000, True), ("east", 560_000, False),
               ("west", 930_000, True), ("central", 2_100_000, True)]
_INSURANCE = ["public", "private", "none"]


def generate_patients(visits: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """One row per patient of `visits`: sex and age as there (the same on every visit), the rest drawn anew."""
    first = np.unique(visits["patient_id"], return_index=True)[1]
    patients = first.size
    rng = np.random.default_rng([seed, 1])  # a second stream: visits' draws are unchanged
    age = visits["age"][first]
    chronic = np.minimum(rng.poisson(0.3 + age / 30), 10).astype(np.int64)
    return {
        "patient_id": visits["patient_id"][first],
        "birth_year": (2024 - age).astype(np.int64),
        "sex": visits["sex"][first],
        "insurance": np.array(_INSURANCE, dtype=object)[rng.choice(3, size=patients, p=[0.55, 0.35, 0.1])],
        "chronic_conditions": chronic,
    }


def write_table(columns: dict[str, np.ndarray] | list[tuple], names: list[str], out: Path) -> None:
    con = duckdb.connect()
    if isinstance(columns, list):
        columns = {name: np.array([row[i] for row in columns], dtype=object if isinstance(columns[0][i], str)
                                  else None) for i, name in enumerate(names)}
    con.register("t", columns)
    con.execute(f"COPY (SELECT {', '.join(names)} FROM t) TO '{out}' (FORMAT CSV, HEADER)")


def write(columns: dict[str, np.ndarray], out: Path) -> int:
    con = duckdb.connect()
    con.register("visits", columns)
    select = ("SELECT patient_id, DATE '2023-01-01' + visit_day::INTEGER AS visit_date, region, department, age, "
              "sex, smoker, CASE WHEN isnan(cost) THEN NULL ELSE cost END AS cost, length_of_stay FROM visits")
    fmt = "PARQUET" if out.suffix == ".parquet" else "CSV, HEADER"
    out.parent.mkdir(parents=True, exist_ok=True)
    con.execute(f"COPY ({select}) TO '{out}' (FORMAT {fmt})")
    return len(columns["patient_id"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=2000)
    parser.add_argument("--max-visits", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("visits.csv"))
    parser.add_argument("--visits-only", action="store_true", help="write visits only, not the other tables")
    args = parser.parse_args()
    visits = generate(args.patients, args.max_visits, args.seed)
    rows = write(visits, args.out)
    print(f"wrote {rows} rows for {args.patients} patients to {args.out}")
    if args.visits_only:
        return
    folder = args.out.parent
    write_table(generate_patients(visits, args.seed), ["patient_id", "birth_year", "sex", "insurance",
                                                       "chronic_conditions"], folder / "patients.csv")
    write_table(DEPARTMENT_ROWS, ["department", "floor", "beds", "specialty_group"], folder / "departments.csv")
    write_table(REGION_ROWS, ["region", "population", "urban"], folder / "regions.csv")
    print(f"wrote patients.csv, departments.csv and regions.csv to {folder}")


if __name__ == "__main__":
    main()
