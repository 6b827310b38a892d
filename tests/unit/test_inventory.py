"""The inventory: YAML loading with file:line errors, and seeded host selection with its guard rails."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.cluster.inventory import (
    Host,
    HostSelector,
    Inventory,
    InventoryError,
    SelectionError,
    dump_inventory,
    load_inventory,
    parse_inventory,
    select,
)
from chaos.spec.scenario import ScenarioError

GOOD = """\
known_hosts: keys/known_hosts
hosts:
  - name: h1
    address: 10.0.0.1
    key_file: keys/id_ed25519
    groups: [trainers]
    labels: {rack: r1}
  - name: h2
    address: 10.0.0.2
    port: 2222
    user: chaos
    sudo: true
    groups: [trainers]
  - name: h3
    address: db.example
    groups: [storage]
    python: /usr/bin/python3
"""


def _inventory(count: int = 6) -> Inventory:
    return Inventory(
        hosts=[
            Host(name=f"n{i}", address=f"10.1.0.{i}", groups=["even" if i % 2 == 0 else "odd"]) for i in range(count)
        ]
    )


def _names(hosts: list[Host]) -> list[str]:
    return [h.name for h in hosts]


# --- loading --------------------------------------------------------------------------------------------------


def test_load_resolves_relative_paths_against_the_file(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(GOOD)
    inventory = load_inventory(path)
    h1, h2, h3 = inventory.hosts
    assert inventory.known_hosts == tmp_path / "keys" / "known_hosts"
    assert h1.key_file == tmp_path / "keys" / "id_ed25519"
    assert (h1.port, h1.user, h1.sudo, h1.labels) == (22, "root", False, {"rack": "r1"})
    assert (h2.port, h2.user, h2.sudo, h2.key_file) == (2222, "chaos", True, None)
    assert h3.python == "/usr/bin/python3"
    assert inventory.accept_unknown_host_keys is False
    assert inventory.groups() == ["all", "storage", "trainers"]


def test_dump_then_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(GOOD)
    inventory = load_inventory(path)
    copy = tmp_path / "copy.yaml"
    dump_inventory(inventory, copy)
    assert load_inventory(copy) == inventory


@pytest.mark.parametrize(
    ("text", "line", "message", "hint"),
    [
        (
            "hosts:\n  - name: h1\n    adress: 10.0.0.1\n",
            3,
            "unknown key 'adress' in hosts.0",
            "did you mean 'address'?",
        ),
        ("hosts:\n  - name: h1\n", 2, "missing required key 'address'", "add address: <value>"),
        ("hosts:\n  - name: h1\n    address: a\n    port: 70000\n", 4, "hosts.0.port:", ""),
        ("hosts:\n  - {name: a, address: x}\n  - {name: a, address: y}\n", 3, "duplicate host name 'a'", "unique"),
        ("hosts: []\n", 1, "hosts: List should have at least 1 item", ""),
        ("hosts:\n  - name: 'bad name'\n    address: a\n", 2, "hosts.0.name: String should match", ""),
        ("hosts:\n  - name: h1\n    address: a\n    groups: ['x y']\n", 4, "group name 'x y'", ""),
        ("hosts:\n  - name: h1\n    address: a\n    address: b\n", 4, "duplicate key 'address'", ""),
        ("knwon_hosts: x\nhosts:\n  - {name: a, address: b}\n", 1, "unknown key 'knwon_hosts'", "'known_hosts'"),
        ("hosts: [\n", 2, "YAML syntax", "indentation"),
        ("- just a list\n", 1, "must be a YAML mapping", ""),
    ],
)
def test_errors_name_file_and_line(text: str, line: int, message: str, hint: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert isinstance(caught.value, ScenarioError)  # the CLI's existing error printing applies
    rendered = str(caught.value)
    assert any(str(p).startswith(f"inv.yaml:{line}:") and message in str(p) for p in caught.value.problems), rendered
    assert hint in rendered


def test_unreadable_file_is_an_inventory_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory(tmp_path / "missing.yaml")


# --- selection ------------------------------------------------------------------------------------------------


def test_selection_is_deterministic_per_seed_and_in_inventory_order() -> None:
    inventory = _inventory(10)
    selector = HostSelector(count=3)
    picks = [_names(select(inventory, selector, random.Random(seed))) for seed in range(20)]
    assert picks == [_names(select(inventory, selector, random.Random(seed))) for seed in range(20)]
    assert len({tuple(p) for p in picks}) > 1  # different seeds, different hosts
    for pick in picks:
        assert pick == sorted(pick, key=lambda n: int(n[1:]))


def test_selection_by_host_group_and_all() -> None:
    inventory = _inventory()
    rng = random.Random(0)
    assert _names(select(inventory, HostSelector(host="n2"), rng)) == ["n2"]
    assert _names(select(inventory, HostSelector(group="odd"), rng)) == ["n1", "n3", "n5"]
    assert _names(select(inventory, HostSelector(), rng)) == [f"n{i}" for i in range(6)]
    assert _names(select(inventory, HostSelector(group="all", exclude=["n0", "n5"]), rng)) == ["n1", "n2", "n3", "n4"]
    assert set(_names(select(inventory, HostSelector(group="even", count=2), rng))) <= {"n0", "n2", "n4"}


def test_protected_hosts_are_never_selected() -> None:
    inventory = _inventory()
    for seed in range(30):
        picked = select(inventory, HostSelector(count=3), random.Random(seed), protected={"n0", "n1"})
        assert not {"n0", "n1"} & set(_names(picked))
    with pytest.raises(SelectionError, match="'n0' is protected"):
        select(inventory, HostSelector(host="n0"), random.Random(0), protected={"n0"})


@pytest.mark.parametrize(
    ("selector", "kwargs", "message"),
    [
        (HostSelector(host="n9"), {}, "no host named 'n9' in the inventory; known: n0, n1"),
        (HostSelector(host="n10"), {}, "no host named 'n10'.*did you mean 'n1'"),
        (HostSelector(group="evn"), {}, "no host is in group 'evn'.*did you mean 'even'"),
        (HostSelector(exclude=["nope"]), {}, "'nope' is not in the inventory"),
        (HostSelector(group="odd", exclude=["n1", "n3", "n5"]), {}, "all are excluded or protected"),
        (HostSelector(group="odd"), {"protected": {"n1", "n3", "n5"}}, "all are excluded or protected"),
        (HostSelector(group="odd", count=4), {}, "asked for 4 host.*only 3"),
        (HostSelector(host="n1", exclude=["n1"]), {}, "both selected and excluded"),
        (HostSelector(count=3), {"blast_radius": 2}, "hits 3 hosts, more than the blast radius of 2"),
        (HostSelector(), {"blast_radius": 5}, "hits 6 hosts"),
    ],
)
def test_selection_errors_are_clear(selector: HostSelector, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SelectionError, match=message):
        select(_inventory(), selector, random.Random(0), **kwargs)  # type: ignore[arg-type]


def test_within_blast_radius_passes() -> None:
    picked = select(_inventory(), HostSelector(count=2), random.Random(1), blast_radius=2)
    assert len(picked) == 2


def test_selector_rejects_contradictions() -> None:
    with pytest.raises(ValueError, match="one of host, rank, group, slurm or role, not host and group"):
        HostSelector(host="n1", group="odd")
    with pytest.raises(ValueError, match="count makes no sense"):
        HostSelector(host="n1", count=2)
    with pytest.raises(ValueError):
        HostSelector(count=0)


def test_an_inventory_that_is_not_utf8_is_named_at_its_line_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"hosts:\n  - name: a\xff\n    address: 10.0.0.1\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    [problem] = info.value.problems
    assert problem.line == 2 and "not UTF-8 text: byte 0xff" in str(problem)
