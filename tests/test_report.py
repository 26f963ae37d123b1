"""`report RUN|DIGEST`: one self-contained HTML page, checked in a real headless browser."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stateset_backend.cli import main
from stateset_backend.conformance.specs import MINIMAL
from stateset_backend.spec.content import sha256_file

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)

pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")



def tiny_spec(**changes):
    """The native tests' tiny spec (tests/native/conftest.py), loaded by path."""
    import importlib.util

    where = Path(__file__).parent / "native" / "conftest.py"
    spec = importlib.util.spec_from_file_location("native_tiny_spec", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tiny_spec(**changes)

HOSTILE = "<script>alert('x')</script> & \"quoted\" <img src=http://example.invalid/x>"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _json(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A short native run (every curve, validation, checkpoints, a selection) and two echo
    runs of one experiment whose name is hostile HTML."""
    root = tmp_path_factory.mktemp("report")
    runs = root / "runs"
    native = tiny_spec(**{"budget.total_updates": 2, "budget.prompts_per_update": 2,
                          "budget.ppo_epochs": 1, "budget.mini_batches": 1,
                          "algorithm.group_size": 2, "checkpoint.every": 1,
                          "evaluation.every": 1})
    (root / "native.json").write_text(json.dumps(native))
    assert main(["run", "--engine", "native", "--runs-dir", str(runs), "--quiet",
                 str(root / "native.json")]) == 0
    (root / "data").mkdir()
    train = root / "data" / "train.jsonl"
    train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)
    reward = root / "reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
    echo = copy.deepcopy(MINIMAL)
    echo["name"] = HOSTILE
    echo["labels"] = {"note": HOSTILE}
    echo["data"]["train"]["sha256"] = sha256_file(train)
    echo["reward"]["sha256"] = sha256_file(reward)
    (root / "echo.json").write_text(json.dumps(echo))
    for _ in range(2):
        assert main(["run", "--engine", "echo", "--runs-dir", str(runs), "--quiet",
                     str(root / "echo.json")]) == 0
    return runs


def _runs(store: Path, capsys, engine: str) -> list[dict]:
    return _json(capsys, "runs", "list", "--runs-dir", str(store), "--engine", engine)["runs"]


def test_a_run_report_holds_every_section(store, capsys, tmp_path):
    (run,) = _runs(store, capsys, "native")
    out = tmp_path / "native.html"
    doc = _json(capsys, "report", "--runs-dir", str(store), run["run_id"], "-o", str(out))
    assert doc == {"report": str(out), "runs": [run["run_id"]], "not_shown": []}
    page = out.read_text()
    result = json.loads((store / run["run_id"] / "result.json").read_text())
    for value in (run["experiment_digest"], result["binding_digest"], result["plan_checksum"],
                  "native 0.1.0", "1234", "none declared"):
        assert value in page
    for check in result["checks"]:
        assert check["name"] in page
    for title in ("Reward", "Loss", "KL", "Entropy", "Response length"):
        assert f'alt="{title}: ' in page
    assert "val/reward/mean" in page and "No held-out test evaluation" in page
    for art in result["artifacts"]:
        assert art["sha256"] in page
    assert result["selection"]["checkpoint"] in page and "recommended" in page
    # self-contained: nothing is fetched, every image is inline
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", page)
    assert page.count("<img ") == page.count('src="data:image/png;base64,') == 5


def test_a_digest_report_overlays_every_run_and_escapes_what_it_shows(store, capsys,
                                                                        tmp_path):
    runs = _runs(store, capsys, "echo")
    digest = runs[0]["experiment_digest"]
    out = tmp_path / "digest.html"
    doc = _json(capsys, "report", "--runs-dir", str(store), digest, "-o", str(out))
    assert sorted(doc["runs"]) == sorted(r["run_id"] for r in runs)
    page = out.read_text()
    assert "2 run(s) of experiment" in page and all(r["run_id"] in page for r in runs)
    assert "<script" not in page and "<img src=http" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in page
    assert page.count("<img ") == 1  # only the reward panel has data; both runs on it


def test_report_refuses_an_unknown_target(store, capsys):
    assert main(["report", "--runs-dir", str(store), "no-such-run"]) == 2
    assert main(["report", "--runs-dir", str(store), "../../etc"]) == 2
    assert main(["report", "--runs-dir", str(store), "sha256:" + "0" * 64]) == 2
    capsys.readouterr()


# -- the page in a real browser ----------------------------------------------------------
# Inserted before the page's own Content-Security-Policy (which forbids scripts), it records
# every error event, CSP violation and console.error, then, once the page has loaded, writes
# what it saw into the DOM that --dump-dom prints.
PROBE = """<script>
var seen = [];
addEventListener("error", function (e) {
  var t = e.target;
  seen.push(t && t !== window ? "failed to load " + (t.src || t.href || t.tagName)
                              : "error: " + e.message);
}, true);
document.addEventListener("securitypolicyviolation", function (e) {
  seen.push("csp: " + e.violatedDirective + " " + e.blockedURI);
});
var consoleError = console.error;
console.error = function () {
  seen.push("console: " + Array.prototype.join.call(arguments, " "));
  consoleError.apply(console, arguments);
};
addEventListener("load", function () {
  var out = document.createElement("pre");
  out.id = "browser-check";
  out.textContent = JSON.stringify({
    errors: seen,
    images: Array.prototype.map.call(document.images, function (i) {
      return {complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}; }),
    fetched: performance.getEntriesByType("resource").map(function (r) { return r.name; })
  });
  document.body.appendChild(out);
});
</script>"""


def _in_browser(page: Path, tmp_path: Path) -> tuple[dict, list[str]]:
    probed = tmp_path / f"probed-{page.name}"
    text = page.read_text()
    assert text.count('<meta charset="utf-8">') == 1
    probed.write_text(text.replace('<meta charset="utf-8">', '<meta charset="utf-8">' + PROBE))
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=60)
    found = re.search(r'<pre id="browser-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the page did not finish loading: {proc.stderr[-2000:]}"
    import html

    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(html.unescape(found.group(1))), console


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: sudo apt-get "
                                             "install chromium (the README's test command)")
def test_the_pages_load_in_headless_chromium_without_errors(store, capsys, tmp_path):
    native = _runs(store, capsys, "native")[0]["run_id"]
    digest = _runs(store, capsys, "echo")[0]["experiment_digest"]
    for name, target in (("run.html", native), ("digest.html", digest)):
        out = tmp_path / name
        assert main(["report", "--runs-dir", str(store), target, "-o", str(out)]) == 0
        seen, console = _in_browser(out, tmp_path)
        assert seen["errors"] == [] and console == [], (seen["errors"], console)
        assert seen["fetched"] == []
        assert seen["images"] and all(i["complete"] and i["width"] > 0 and i["height"] > 0
                                      for i in seen["images"]), seen["images"]
    capsys.readouterr()


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: sudo apt-get "
                                             "install chromium (the README's test command)")
def test_the_browser_check_sees_a_broken_image_and_a_fetch(tmp_path):
    """The check above can fail: a page with an undecodable image and a remote one fails it."""
    from stateset_backend.publish.report import CSP

    page = tmp_path / "broken.html"
    page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8">'
                    f'<meta http-equiv="Content-Security-Policy" content="{CSP}"></head><body>'
                    f'<img src="data:image/png;base64,AAAA">'
                    f'<img src="http://example.invalid/x.png"></body></html>')
    seen, console = _in_browser(page, tmp_path)
    assert [i["width"] for i in seen["images"]] == [0, 0]
    assert any(e.startswith("csp: img-src") for e in seen["errors"]) and console


def test_report_does_not_load_matplotlib_for_other_commands(minimal, write_json):
    probe = ("import sys\nfrom stateset_backend.cli import main\n"
             "for args in (['--help'], ['validate', sys.argv[1]],"
             " ['plan', '--engine', 'native', sys.argv[1]]):\n"
             "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
             "heavy = [m for m in ('matplotlib', 'mlflow', 'in_toto_attestation',"
             " 'google.protobuf') if m in sys.modules]\n"
             "print('HEAVY=' + ','.join(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(write_json(minimal))],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[-1] == "HEAVY=", proc.stderr
