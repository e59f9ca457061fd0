"""docs/rl.md's fault table is what the faults do: it is made again here and compared."""

from __future__ import annotations

from tests.support import fault_table as fleet_fault_table


def test_the_fault_table_in_the_docs_is_what_a_new_run_gives():
    page = fleet_fault_table.PAGE.read_text()
    assert fleet_fault_table.in_page(page) == fleet_fault_table.table(), (
        "docs/rl.md's fault table is stale: python -m tests.support.fault_table --write"
    )
