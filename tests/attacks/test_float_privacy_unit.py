"""A float column as the privacy unit: DuckDB groups, partitions and joins 0.0 and -0.0 as one value (and a CSV
id beyond 2**53 is read rounded, so 9007199254740993 and 9007199254740992 become one), so two people were one unit
to the cap: their rows shared its m, and the rows kept for one depended on the other's.

Found: person A with id 0.0 (a row in group 'a') and person B with id -0.0 (a row in group 'b'), 49 others, m = 1:
`SELECT g, COUNT(*) FROM f GROUP BY g` moved by 2 in L1 when B was removed ({'a': 24, 'b': 26} -> {'a': 25,
'b': 25}: B's row out, A's row, dropped before by the shared cap, back in) for 6 of 11 bounding salts, against the
sensitivity m = 1 of the noise. Join keys that are floats were already refused for the same reason."""

from __future__ import annotations

import pytest

from benchmarks.support import write_csv, write_policy
from dpsql.errors import PolicyError
from dpsql.policy import load_policy


def test_a_float_column_cannot_be_the_privacy_unit(tmp_path) -> None:
    write_csv(tmp_path / "t.csv", ["uid", "g"], [(0.0, "a"), (-0.0, "b"), (1.0, "a")])
    policy = write_policy(tmp_path / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "uid", "max_rows_per_unit": 1,
              "columns": {"uid": {"type": "float"}, "g": {"type": "text", "values": ["a", "b"]}}}})
    with pytest.raises(PolicyError, match="privacy_unit.*float"):
        load_policy(policy)
