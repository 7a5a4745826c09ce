"""configs/papers/README.md indexes every table and figure of the four papers: each row names the config that
reproduces it or gives a labelled reason why there is none. This test guards that index: every config in
configs/papers/ is named in a row, every row's last column is filled, every config it names exists, and a row
without a config starts with one of the README's reason labels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAPERS = REPO / "configs" / "papers"
INDEX = PAPERS / "README.md"
HEADER = ["table/figure", "what it shows", "config or reason"]
REASONS = ("config not written yet:", "component not built:", "dataset not in ../shared/data:", "closed model:",
           "human evaluation:", "no numbers:", "not a result:")
YAML = re.compile(r"[\w.-]+\.yaml")


def rows() -> list[tuple[str, str, list[str]]]:
    """(section, first line of the row, cells) for every data row of the index's tables."""
    out, section = [], ""
    for line in INDEX.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells != HEADER and not set(line) <= set("|-: "):
                out.append((section, line, cells))
    return out


ROWS = rows()


def test_every_paper_has_a_section_with_rows():
    sections = {s for s, _, _ in ROWS}
    assert [s[:8] for s in sorted(sections)] == ["Seed 001", "Seed 002", "Seed 003", "Seed 004"]


def test_every_config_is_named_in_the_index():
    named = {name for _, _, cells in ROWS for name in YAML.findall(cells[-1])}
    missing = sorted(p.name for p in PAPERS.glob("*.yaml") if p.name not in named)
    assert not missing, f"configs/papers/README.md names no row for {missing}"


@pytest.mark.parametrize("section,line,cells", ROWS, ids=[f"{s[:8]}: {c[0]}" for s, _, c in ROWS])
def test_a_row_names_an_existing_config_or_a_reason(section: str, line: str, cells: list[str]):
    assert len(cells) == len(HEADER), f"{section}: the row does not have {len(HEADER)} columns: {line}"
    last = cells[-1]
    assert last, f"{section}: the row gives neither a config nor a reason: {line}"
    configs = YAML.findall(last)
    for name in configs:
        assert (PAPERS / name).is_file(), f"{section}: {name} is not a file in configs/papers/: {line}"
    assert configs or last.startswith(REASONS), f"{section}: the row names no .yaml config and no reason label: {line}"
