"""The README's facts that come from code agree with the code: its exit codes with the error
classes, its command table with the CLI's parser (every command exists, every exit code it
lists is a real one) and the examples' sizes with the example specs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from stateset_backend.cli import build_parser
from stateset_backend.common import errors

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EN_DASH = "\u2013"


def _codes() -> dict[int, type]:
    found = {0: object}
    stack = [errors.StatesetError]
    while stack:
        cls = stack.pop()
        stack += cls.__subclasses__()
        if cls.exit_code != 1:  # 1 is a bug of ours, never documented as an outcome
            found[cls.exit_code] = cls
    return found


def test_the_exit_code_line_lists_every_code_the_errors_raise():
    line = re.search(r"Exit codes: (.*?)\.\n", README, re.S)
    assert line is not None, "the README lost its exit-code line"
    listed = {int(n) for n in re.findall(r"(\d+) [a-z]", line.group(1))}
    assert listed == set(_codes())


def _commands() -> dict[str, set[str]]:
    """Every command and ``group subcommand`` the parser knows."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    out: dict[str, set[str]] = {}
    for name, child in sub.choices.items():  # type: ignore[union-attr]
        nested = [a for a in child._actions if getattr(a, "choices", None) and
                  a.dest.endswith("_command")]
        out[name] = set(nested[0].choices) if nested else set()
    return out


def test_every_command_in_the_table_exists_and_lists_real_exit_codes():
    table = README[README.index("## Commands"):README.index("## Concepts")]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    commands, codes = _commands(), set(_codes())
    assert len(rows) >= 15
    for row in rows:
        words = row.split("`")[1].split()
        assert words[0] in commands, row
        if commands[words[0]] and len(words) > 1 and words[1] in commands[words[0]]:
            pass  # a subcommand (runs list, runs show, ...)
        elif commands[words[0]]:
            raise AssertionError(f"{words[:2]} is not a subcommand of {words[0]}")
        listed = row.rstrip(" |").rsplit("|", 1)[-1]
        numbers = set()
        for part in listed.split(","):
            part = part.strip()
            if EN_DASH in part:  # a range such as 2 to 6
                low, high = map(int, part.split(EN_DASH))
                numbers |= set(range(low, high + 1))
            elif part:
                numbers.add(int(part))
        assert numbers <= codes, (row, numbers - codes)
    documented = {r.split("`")[1].split()[0] for r in rows}
    assert documented == set(commands), set(commands) ^ documented


def _benchmark(name: str):
    """benchmarks/<name>.py, which measures something and renders the README's table of it."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark",
                                                  ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _examples_benchmark():
    return _benchmark("examples")


def test_the_examples_table_is_the_stored_measurement_of_the_specs():
    bench = _examples_benchmark()
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    start, end = README.index(bench.BEGIN), README.index(bench.END) + len(bench.END)
    # sizes come from today's specs, times and rewards from the measurement
    assert README[start:end] == bench.render(measured)
    assert {r["spec"] for r in measured["runs"]} <= {p.name for p in (ROOT / "examples").glob(
        "*.json")}
    assert all(r["learning"]["status"] == "succeeded" and len(r["wall_s"]) ==
               measured["rounds"] for r in measured["runs"])


def test_the_screen_shows_the_measured_main_job():
    bench = _examples_benchmark()
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    shown = bench.SCREEN_TIME.findall(README)
    assert shown == [bench.screen_time(measured)]


@pytest.mark.parametrize("name", ["native_vs_trl", "profile_native", "rehearse"])
def test_the_performance_sections_are_the_stored_measurements(name):
    """The README's speed claims are rendered from a stored run of the benchmark, with its
    machine and command, never typed in."""
    bench = _benchmark(name)
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    start, end = README.index(bench.BEGIN), README.index(bench.END) + len(bench.END)
    assert README[start:end] == bench.render(measured)
    assert measured["command"].startswith(f"python benchmarks/{name}.py")


def test_the_native_vs_trl_measurement_covers_every_shape_in_interleaved_rounds():
    """Every shape and the hub's overhead, each with one value per kept round, the ratio
    paired round by round, the threads fixed alike on both sides."""
    bench = _benchmark("native_vs_trl")
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    rounds, machine = measured["rounds"], measured["machine"]
    assert set(measured["shapes"]) == set(bench.SHAPES)
    assert rounds >= 3 and measured["warmup"] >= 0
    assert machine["torch_threads"] >= 1 and machine["interop_threads"] == machine[
        "torch_threads"]
    # a row kept from an earlier run (a shape not measured this time) carries its own rounds
    for shape in measured["shapes"].values():
        native, trl = (shape[side]["updates_per_s"]["rounds"] for side in bench.SIDES)
        assert shape.get("rounds", rounds) >= 3
        assert len(native) == len(trl) == len(shape["ratio"]["rounds"]) == \
            shape.get("rounds", rounds)
        # each stored rate is rounded to 0.001: a slow shape's ratio moves by that much more
        for ratio, n, t in zip(shape["ratio"]["rounds"], native, trl, strict=True):
            rounding = n / t * (0.0005 / n + 0.0005 / t)
            assert ratio == pytest.approx(n / t, rel=0.01, abs=0.01 + rounding)
    hub = measured["hub"]
    assert len(hub["ratio"]["rounds"]) == hub.get("rounds", rounds) >= 3


def test_the_profile_measures_the_share_outside_torch_on_every_compared_shape():
    """The share outside torch's operators is stated for every shape the comparison with TRL
    runs, each from profiled updates against the same updates' plain wall time, for the
    native engine and for TRL alike."""
    bench = _benchmark("profile_native")
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    shapes = list(_benchmark("shapes").SHAPES)
    # a shape too long for the profiled stretches in a minute is profiled by its anatomy
    assert [s for s in shapes if s in measured["outside_torch"]] == list(measured["outside_torch"])
    assert set(shapes) - set(measured["outside_torch"]) <= set(measured["anatomy"])
    for shape in measured["outside_torch"].values():
        assert shape["updates"] >= shape["stretches"] >= 3
        assert 0 < shape["update_ms_plain"] < shape["update_ms_profiled"]
        assert 0 < shape["outside_ms"] < shape["update_ms_profiled"]
        assert 0 < shape["share"] < 1
        # the model's phases are measured within the same updates, and lie inside them
        assert list(shape["phases"]) == list(bench.MODEL_PHASES)
        assert sum(p["ms_profiled"] for p in shape["phases"].values()) < \
            shape["update_ms_profiled"]
        assert 0 < shape["model_phases_share"] < 1
    # TRL, the named reference, by the same schedule and rule on the same shapes
    assert list(measured["trl_outside_torch"]) == list(measured["outside_torch"])
    for shape in measured["trl_outside_torch"].values():
        assert shape["updates"] >= shape["stretches"] >= 3
        assert 0 < shape["update_ms_plain"] < shape["update_ms_profiled"]
        assert 0 < shape["inside_ms"] < shape["update_ms_profiled"]
        assert 0 < shape["outside_ms"] < shape["update_ms_profiled"]
        assert 0 < shape["share"] < 1


def test_python_inside_a_custom_autograd_function_counts_outside_torch():
    """torch records a custom autograd Function's forward and backward like operators, with
    their Python inside (TRL computes its log-probs in one): the measure sees through them to
    the operators they call, or an engine's Python would be credited to torch."""
    import time

    import torch

    measure = _benchmark("outside_torch")

    class PythonHeavy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            time.sleep(0.01)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            time.sleep(0.01)
            return grad * 2

    class Straight(torch.autograd.Function):
        """A backward that calls no operator at all, between two of the engine's functions."""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            time.sleep(0.01)
            return grad

    for function in (PythonHeavy, Straight):
        schedule = measure.Stretches(warmup=1, per=1, count=3)
        x = torch.ones(4, requires_grad=True)
        for _ in range(schedule.updates):
            schedule.begin_update()
            (function.apply(x * 3) * 2).sum().backward()
        got = schedule.result()
        assert got["updates"] == 3 and got["share"] > 0.9, function.__name__


def test_the_compile_cost_is_a_stored_measurement_in_interleaved_rounds():
    """Every figure of the compile benchmark has one value per round, and the speed-up is
    paired round by round, as the README's benchmark table says it is measured."""
    bench = _benchmark("compile_cost")
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    assert measured["command"].startswith("python benchmarks/compile_cost.py")
    assert measured["rounds"] >= 3 and set(measured["shapes"]) <= set(_benchmark("shapes").SHAPES)
    for shape in measured["shapes"].values():
        assert all(len(v["rounds"]) == measured["rounds"] for v in shape.values())
        assert shape["speedup"]["rounds"] == pytest.approx(
            [e / c for e, c in zip(shape["eager_ms_per_step"]["rounds"],
                                   shape["compiled_ms_per_step"]["rounds"], strict=True)],
            rel=0.01, abs=0.01)


def test_the_cold_start_table_is_the_stored_measurement_of_every_command():
    bench = _benchmark("cold_start")
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    start, end = README.index(bench.BEGIN), README.index(bench.END) + len(bench.END)
    assert README[start:end] == bench.render(measured)
    # every command and `runs` subcommand the parser has is timed, each against today's
    # declaration of the dependencies it needs
    timed = {tuple(row["argv"][:2 if row["argv"][0] == "runs" else 1])
             for row in measured["commands"]}
    commands = _commands()
    assert timed == {(name,) for name, subs in commands.items() if not subs} | \
        {(name, sub) for name, subs in commands.items() for sub in subs}
    assert all(b["imports"] == bench.import_names(b["extra"]) for b in measured["baselines"])
    assert all(len(row["wall_s"]) == measured["rounds"]
               for row in measured["commands"] + measured["baselines"])
    # each command against the modules of its dependencies it loads, timed in the same rounds
    assert all(len(row["dependency_modules"]["wall_s"]) == measured["rounds"] and
               row["dependency_modules"]["count"] > 0 for row in measured["commands"]
               if row["argv"][:2] != ["schema", "spec"])


def test_an_update_is_taken_apart_by_the_operators_it_ran():
    """The anatomy's kinds of work come from the operators a profiled step ran on its own
    thread: a linear layer's products (forward and backward), torch's fused attention
    (forward and backward), every other operator, and the wall time outside them."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.profiler import profile, record_function
    from torch.utils.flop_counter import FlopCounterMode

    anatomy = _benchmark("profile_native").anatomy
    x, w = torch.randn(512, 256, requires_grad=True), torch.randn(256, 256)
    q = torch.randn(4, 8, 128, 32, requires_grad=True)

    def step() -> None:
        with record_function(anatomy.MARK + "learner update"):
            F.scaled_dot_product_attention(q, q, q).sum().backward()
            F.linear(x, w).relu().sum().backward()

    with FlopCounterMode(display=False, custom_mapping=anatomy._attention_flops()) as flops:
        step()
    gflop = anatomy.gflop_by_kind(flops.get_flop_counts()["Global"])
    assert gflop["matrix products"] == pytest.approx(2 * 2 * 512 * 256 * 256 / 1e9, abs=1e-3)
    assert gflop["attention"] > 0
    assert sum(gflop.values()) == pytest.approx(flops.get_total_flops() / 1e9, abs=2e-3)
    with profile() as prof:
        start = time.perf_counter()
        step()
        wall_ms = 1e3 * (time.perf_counter() - start)
    work = anatomy.work_by_kind(prof.events(), wall_ms)
    assert set(work) == {"matrix products", "attention", "other operators",
                         "outside operators"}
    assert all(work[k] > 0 for k in ("matrix products", "attention", "other operators"))
    assert sum(work.values()) == pytest.approx(wall_ms, abs=0.1)


def test_the_profile_holds_every_completion_length_against_its_floors():
    """Each completion length's update is taken apart (the model's phases, its operators and
    FLOPs) and held against its two floors measured on the same machine: the dispatch floor
    (its operators at a trivial operator's cost) and the arithmetic floor (its FLOPs at the
    machine's matrix-product throughput); an update costs more than either."""
    bench = _benchmark("profile_native")
    measured = json.loads(bench.MEASURED.read_text(encoding="utf-8"))
    shapes = _benchmark("shapes").SHAPES
    completions = [s for s in shapes if s == "readme" or s.startswith("completions-")]
    assert set(completions) <= set(measured["anatomy"])
    for name in completions:
        a = measured["anatomy"][name]
        assert a["tokens_sampled_per_row"] <= (shapes[name].completion_tokens or 2)
        assert 0 < sum(a["phases_ms"].values()) == pytest.approx(a["update_ms"], abs=0.1)
        assert a["operators"]["total"] == sum(v for k, v in a["operators"].items()
                                              if k != "total") > 0
        assert a["gflop"] > 0 and a["trivial_op_us"] > 0
        assert 0 < max(a["floors_ms"].values()) < a["update_ms"]
        # the update by kind of work: its FLOPs are the products' and attention's, its time
        # adds up to the profiled update, and faster kernels alone leave the rest of it
        work, kinds = a["work_ms"], a["gflop_by_kind"]
        assert sum(kinds.values()) == pytest.approx(a["gflop"], abs=0.01)
        assert kinds["matrix products"] > 0 and kinds["attention"] > 0
        assert sum(v for k, v in work.items() if k != "profiled update") == \
            pytest.approx(work["profiled update"], abs=0.1)
        assert min(work.values()) > 0
        assert 0 < a["products_at_rate_attention_free_ms"] < a["update_ms"]
