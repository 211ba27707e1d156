"""Recipe and lab validation: every bad input is refused with one line naming the file and field."""

import json
from pathlib import Path

import pytest
from conftest import REPO

from devicelab import lab, recipes
from devicelab.errors import DevicelabError
from devicelab.plan import expand

OK = """
name: t
models: [{name: m, source: /x.gguf}]
quants: [q8_0, Q4_K_M]
payloads:
  - {kind: bench, threads: [1, 2]}
  - {kind: kld}
"""


def write(tmp_path, text, name="r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_valid_recipe_expands_to_cells(tmp_path):
    r, sha = recipes.load(write(tmp_path, OK))
    assert r.quants == ["q8_0", "q4_k_m"]
    cells = expand(r, "0c1e570", {"m": "ab" * 32})
    # 2 quants × (bench × 2 thread counts + kld)
    assert len(cells) == 6 and len({c.cell_id for c in cells}) == 6
    # ids are stable, and change with the llama.cpp commit
    assert [c.cell_id for c in cells] == [c.cell_id for c in expand(r, "0c1e570", {"m": "ab" * 32})]
    assert not {c.cell_id for c in cells} & {c.cell_id for c in expand(r, "deadbee", {"m": "ab" * 32})}


@pytest.mark.parametrize(
    "text,expect",
    [
        (OK.replace("Q4_K_M", "q9_z"), r"quants: unknown quant type 'q9_z'; use one of f32, f16"),
        (
            OK.replace("threads: [1, 2]", "threads: [0]"),
            r"payloads\.0\.bench\.threads: thread count 0: give an integer ≥ 1 or auto",
        ),
        (
            OK.replace("{kind: kld}", "{kind: kld, ctx: 64, chunks: 1}"),
            r"payloads\.1\.kld: ctx 64 × chunks 1 scores 31 tokens; llama-perplexity prints KL-divergence "
            r"statistics only over ≥ 100",
        ),
        (
            OK.replace("threads: [1, 2]", "threads: [1, 2], cpu_masks: [huge]"),
            r"cpu mask 'huge': give a hex mask \(0xf0\) or prime \| big \| little \| all",
        ),
        (
            OK.replace("kind: kld", "kind: kldx"),
            r"payloads\.1\.kind: unknown 'kldx'; available: 'batched', 'bench', 'eval', 'kld', 'membw'",
        ),
        (
            OK.replace("threads: [1, 2]", "threads: [1, 2], cache_type_k: q8"),
            r"payloads\.0\.bench\.cache_type_k: Input should be 'f32', 'f16'",
        ),
        (OK + "colour: red\n", r"colour: Extra inputs are not permitted"),
        (OK + "rounds: 4\nprecision: 0.02\n", r"precision: goes with rounds: auto"),
        (OK + "rounds: many\n", r"rounds: 'many': give a number of rounds from 1 to 1000, or auto"),
        (OK + "rounds: auto\nmax_rounds: 2\n", r"max_rounds: Input should be greater than or equal to 3"),
        (OK.replace("name: t", "name: 'a b'"), r"name: String should match pattern"),
        ("name: t\nmodels: [\n", r"malformed YAML at line \d+"),
        ("- just\n- a list\n", r"a recipe must be a YAML mapping"),
    ],
)
def test_bad_recipe_one_line(tmp_path, text, expect):
    with pytest.raises(DevicelabError, match=expect) as ei:
        recipes.load(write(tmp_path, text))
    assert "\n" not in str(ei.value)
    assert "r.yaml" in str(ei.value)


def test_missing_recipe(tmp_path):
    with pytest.raises(DevicelabError, match="does not exist"):
        recipes.load(tmp_path / "nope.yaml")


def test_lab_file(tmp_path):
    p = write(tmp_path, "devices:\n  - {name: pi, transport: ssh, host: 127.0.0.1, port: 2222}\n", "lab.yaml")
    L = lab.load(p)
    assert L.device("pi").port == 2222
    assert L.device("local").transport == "local"  # local always exists
    with pytest.raises(DevicelabError, match=r"device 'phone' is not in the lab file \(known: pi\)"):
        L.device("phone")
    with pytest.raises(DevicelabError, match=r"devices\.0\.transport: unknown 'usb'; available: 'local', 'ssh', 'adb'"):
        lab.load(write(tmp_path, "devices:\n  - {name: x, transport: usb}\n", "lab2.yaml"))


def test_rounds_repeat_every_cell_in_a_seeded_order_that_resumes_inside_its_round(tmp_path):
    """`rounds: 3`: every cell three times, ids of their own; each round's order is a random one drawn from the seed
    (the same every time the recipe runs), each cell's place in its device's round recorded; a run resumed with
    some cells done goes on in that order; a recipe without rounds keeps its cells, their ids and their order."""
    import yaml

    from devicelab import plan

    base = yaml.safe_load((REPO / "recipes" / "quickstart.yaml").read_text())
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(base))
    rounds = tmp_path / "rounds.yaml"
    rounds.write_text(yaml.safe_dump({**base, "rounds": 3}))
    shas = {"smollm2-135m": "0" * 64}
    r0, r3 = recipes.load(plain)[0], recipes.load(rounds)[0]
    c0, c3 = plan.expand(r0, "c", shas), plan.expand(r3, "c", shas)
    assert len(c3) == 3 * len(c0) and len({c.cell_id for c in c3}) == len(c3)
    assert not {c.cell_id for c in c0} & {c.cell_id for c in c3}
    assert plan.schedule(r0, [("s", c0)]) == [("s", c0)]  # no rounds: as expanded
    steps = plan.schedule(r3, [("s", c3)])
    assert [sorted({c.round for c in cells}) for _, cells in steps] == [[1], [2], [3]]
    orders = [
        [
            (
                c.model,
                c.quant,
                c.payload,
                json.dumps({k: v for k, v in c.params.items() if k != "round"}, sort_keys=True),
            )
            for c in cells
        ]
        for _, cells in steps
    ]
    assert sorted(orders[0]) == sorted(orders[1]) and orders[0] != orders[1]  # the same cells, another order
    assert all([c.position for c in cells] == list(range(1, len(cells) + 1)) for _, cells in steps)
    assert {c.seed for _, cells in steps for c in cells} == {plan.seed(r3)}
    assert plan.schedule(r3, [("s", c3)]) == steps  # drawn from the seed: the same again
    first = steps[0][1]
    done = {c.cell_id for c in first[:5]}
    resumed = plan.schedule(r3, [("s", c3)], done)
    assert [c.cell_id for c in resumed[0][1]] == [c.cell_id for c in first[5:]]
    assert [c.position for c in resumed[0][1]] == [c.position for c in first[5:]]
    seeded = tmp_path / "seeded.yaml"
    seeded.write_text(yaml.safe_dump({**base, "rounds": 3, "round_seed": 7}))
    other = plan.schedule(recipes.load(seeded)[0], [("s", c3)])
    assert [c.cell_id for c in other[0][1]] != [c.cell_id for c in first]
