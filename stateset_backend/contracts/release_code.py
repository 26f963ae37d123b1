"""Reading a release's own code without installing it: the literals it dispatches on, its
registries and enums, the constants it writes inline, and its small pure functions run on
inputs that expose a number.

Engines that cannot install here (OpenRLHF needs CUDA, NeMo RL ships no wheel, every release
but one of verl lives in a wheel) still carry their meaning in their source; these helpers
are how the surface generator and the kit read it, so what the hub claims about a release is
measured from that release and never restated from an adapter.
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Callable, Iterable
from typing import Any

#: a release's file by its path in the package (``verl/trainer/ppo/core_algos.py``); None
#: where the release has no such file
Read = Callable[[str], "str | None"]


def _subject(node: ast.expr) -> str:
    return ast.unparse(node)


def _matches(node: ast.expr, names: Iterable[str]) -> bool:
    """``loss_type`` matches ``loss_type``, ``self.loss_type``, ``args.loss_type``,
    ``cfg.get("loss_type")`` and ``cfg["loss_type"]``; ``kl_ctrl.type`` matches
    ``self.kl_ctrl.type``."""
    text = _subject(node)
    if any(text == name or text.endswith("." + name) for name in names):
        return True
    key: ast.expr | None = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "get" and node.args:
        key = node.args[0]
    elif isinstance(node, ast.Subscript):
        key = node.slice
    return isinstance(key, ast.Constant) and key.value in set(names)


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _refusals(tree: ast.AST) -> set[int]:
    """The comparisons whose branch only raises (verl's ``if kl_penalty == "full": raise
    NotImplementedError``): a value the code names in order to refuse it is not one it
    implements."""
    return {id(node.test) for node in ast.walk(tree)
            if isinstance(node, ast.If) and node.body
            and all(isinstance(stmt, ast.Raise) for stmt in node.body)}


def compared(source: str, *names: str) -> set[str]:
    """The string literals the code compares a setting with (``==``, ``!=``, ``in``, ``not
    in``, either side), except those whose branch only raises; and, where it strips a suffix
    it tests with ``endswith`` (verl's ``low_var_kl+``, the straight-through form), each
    literal with that suffix too."""
    tree = ast.parse(source)
    refused = _refusals(tree)
    found: set[str] = set()
    suffixes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and id(node) not in refused:
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if _matches(side, names):
                    for other in sides[:i] + sides[i + 1:]:
                        found |= _strings(other)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "endswith" and _matches(node.func.value, names):
            for arg in node.args:
                suffixes |= _strings(arg)
    return found | {value + suffix for value in found for suffix in suffixes
                    if not value.endswith(suffix)}


def enum_members(source: str, cls: str) -> dict[str, str]:
    """The members of a ``class NAME(str, Enum)``: member name → value."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {target.id: stmt.value.value for stmt in node.body
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    for target in stmt.targets if isinstance(target, ast.Name)}
    return {}


def registered(source: str, decorator: str, members: dict[str, str] | None = None) -> set[str]:
    """The names a registry decorator (``@register_policy_loss("gspo")``) registers; an enum
    member argument (``@register_adv_est(AdvantageEstimator.GRPO)``) is its value."""
    members = members or {}
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _subject(node.func).split(".")[-1] == decorator:
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                elif isinstance(arg, ast.Attribute) and arg.attr in members:
                    found.add(members[arg.attr])
    return found




def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and \
            not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    return None


def _names(node: ast.AST) -> set[str]:
    """Every variable and attribute name an expression uses."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def added_constants(source: str, name: str) -> set[float]:
    """The numbers the code adds to an expression that uses the name ``name`` (a variable or
    an attribute, whole: ``rewards.std(-1) + 1e-9`` for ``std``, ``std_rewards + 1e-4`` for
    ``std_rewards``): the epsilons an engine writes inline where it normalises."""
    found: set[float] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            for this, other in ((node.left, node.right), (node.right, node.left)):
                number = _number(other)
                if number is not None and name in _names(this):
                    found.add(number)
    return found


def keyword_values(source: str, call: str, keyword: str) -> set[float]:
    """The numbers a ``call`` (``clamp``, ``SamplingParams``) is given for ``keyword``,
    directly or as the fallback of a ``.get(key, fallback)``."""
    found: set[float] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == call:
            for kw in node.keywords:
                if kw.arg != keyword:
                    continue
                value = kw.value
                if isinstance(value, ast.Call) and ast.unparse(value.func).endswith(".get") \
                        and len(value.args) == 2:
                    value = value.args[1]
                number = _number(value)
                if number is not None:
                    found.add(number)
    return found


def run_function(source: str, names: tuple[str, ...], call: Callable[[dict[str, Any]], Any],
                 ) -> Any:
    """Compile the functions ``names`` (those the source defines; decorators dropped: they
    register, compile or time, and need the rest of the engine) from a release's source with
    torch as their only library, and give them to ``call``: the release's own arithmetic,
    run without importing the release."""
    import torch

    tree = ast.parse(source)
    defs: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            defs.append(node)
    if not defs:
        raise LookupError(f"the source defines none of {', '.join(names)}")
    scope: dict[str, Any] = {"torch": torch, "F": torch.nn.functional, "nn": torch.nn,
                             **{n: getattr(typing, n) for n in typing.__all__}}
    exec(compile(ast.Module(defs, []), "<release source>", "exec"), scope)
    return call(scope)
