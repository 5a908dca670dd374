"""Manifest format, report rendering, run context, suite layout and the CLI, in process."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import ampcore
from ampcore._cli.conformance import pytest_arguments
from ampcore._cli.main import main
from ampcore_conformance._context import UsageProblem, build_context
from ampcore_conformance._manifest import Manifest, ManifestError, Tolerances, load_manifest
from ampcore_conformance._reports import _speed_lines, render_markdown, summarize_speed


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_manifest_entries_and_tolerances(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "m.toml",
        '[skip]\n"test_a[bfloat16-mm]" = "no bf16 mm"\n'
        '[xfail]\n"test_b*" = " bug 7 "\n'
        "[tolerances]\nconvergence_rtol = 0.3\n",
    )
    manifest = load_manifest(path)
    assert [(e.action, e.pattern, e.reason) for e in manifest.entries] == [
        ("skip", "test_a[bfloat16-mm]", "no bf16 mm"),
        ("xfail", "test_b*", "bug 7"),
    ]
    assert manifest.tolerances == Tolerances(convergence_rtol=0.3)


def test_patterns_treat_brackets_literally(tmp_path: Path) -> None:
    manifest = load_manifest(_write(tmp_path, "m.json", '{"skip": {"test_x[*-mm]": "r", "test_y": "r"}}'))
    x, y = manifest.entries
    assert x.matches(["test_x[float16-mm]"]) and not x.matches(["test_x[float16-addmm]"])
    assert not x.matches(["test_xb"]) and y.matches(["test_z[bfloat16]", "test_y"])
    assert manifest.find(["test_x[bfloat16-mm]"]) is x and manifest.find(["test_q"]) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[skip]\n"test_a" = ""\n', "needs a reason"),
        ('[skip]\n"test_a" = 3\n', "needs a reason"),
        ('[skips]\n"test_a" = "r"\n', "unknown section(s) ['skips']"),
        ("[tolerances]\nop_rtol = 1\n", "unknown tolerance(s) ['op_rtol']"),
        ("[tolerances]\nop_eps = -1\n", "expected a positive finite number"),
        ("[skip\n", "not valid TOML"),
    ],
)
def test_invalid_manifests_are_rejected(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, "m.toml", text)
    with pytest.raises(ManifestError, match=re.escape(message)) as info:
        load_manifest(path)
    assert str(path) in str(info.value)


def test_missing_manifest_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "absent.toml")


def test_markdown_summary_has_one_row_per_test() -> None:
    report = {
        "backend": {"name": "acme", "device_type": "acme", "plugin": "acme", "distribution": "ampcore-acme",
                    "version": "1.2", "device_name": "Acme X1"},
        "dtypes": ["float16"], "ampcore": "0.1.0", "torch": "2.13.0", "suite": {"version": "1.0.0"},
        "exit_status": 1, "summary": {"passed": 1, "failed": 1}, "duration_s": 2.5, "problem": None,
        "manifest": {"unmatched": ["test_old"]},
        "tests": [
            {"name": "test_a[float16]", "dtype": "float16", "outcome": "passed", "duration_s": 0.1, "message": None},
            {"name": "test_b", "dtype": None, "outcome": "failed", "duration_s": 0.2, "message": "x | y"},
        ],
        "speed": {"float16": {"workload": "MLP", **summarize_speed([0.002, 0.002, 0.002], [0.001, 0.001, 0.0009]),
                              "fp32_peak_growth_mib": None, "autocast_peak_growth_mib": 1.5}},
    }  # fmt: skip
    text = render_markdown(report)
    assert "| `test_a[float16]` | float16 | passed | 0.100 |  |" in text
    assert "| `test_b` | - | failed | 0.200 | x \\| y |" in text
    assert (
        "ampcore-acme 1.2" in text
        and "`test_old`" in text
        and "| float16 | MLP | 2.000 [2.000-2.000] | 1.000 [0.900-1.000] | 2.00x [2.00-2.22x] | unavailable / 1.5 |"
        in text
    )
    assert "unreliable" not in text and "informative" in text


def test_markdown_flags_a_speed_up_that_swings_between_rounds() -> None:
    lines = "\n".join(
        _speed_lines(
            {
                "bfloat16": {
                    "workload": "MLP",
                    **summarize_speed([0.004, 0.002], [0.0005, 0.004]),
                    "fp32_peak_growth_mib": 0.0,
                    "autocast_peak_growth_mib": 0.0,
                }
            }
        )
    )
    assert "0.50-8.00x] **unreliable" in lines


def test_cli_builds_the_pytest_command(tmp_path: Path) -> None:
    args = pytest_arguments("acme", ["float16"], tmp_path / "r", tmp_path / "m.toml", ["-x"])
    assert args[:4] == ["--pyargs", "ampcore_conformance", "-p", "ampcore_conformance.plugin"]
    assert args[args.index("--ampcore-backend") + 1] == "acme" and args[-1] == "-x"
    assert Path(args[args.index("-c") + 1]).is_file()
    assert args[args.index("--ampcore-report-dir") + 1] == str((tmp_path / "r").resolve())


def test_cli_without_pytest_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pytest", None)  # `import pytest` now raises ImportError
    assert main(["conformance", "--backend", "cpu"]) == 1
    assert "install pytest (pip install 'ampcore[conformance]'" in capsys.readouterr().err


def test_unknown_backend_becomes_the_run_problem() -> None:
    context = build_context("acme", [], Manifest(), None)
    assert not context.usable and context.backend is None
    assert context.problem is not None and context.problem.startswith(
        "no device found for backend 'acme': the backend is not installed"
    )
    with pytest.raises(RuntimeError, match="no device found for backend 'acme'"):
        context.require_backend()


def test_dtype_selection_is_checked_against_the_backend() -> None:
    assert build_context("cpu", ["bf16", "bfloat16"], Manifest(), None).dtypes == (torch.bfloat16,)
    with pytest.raises(
        UsageProblem, match="--ampcore-dtype int8: unknown dtype name; backend 'cpu' declares: bfloat16"
    ):
        build_context("cpu", ["int8"], Manifest(), None)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--backend", "tpu"],
         r"--backend tpu: unknown backend 'tpu' \(did you mean '[cnx]pu'\?\)\. Known backends: cpu"),
        (["--backend", "cpu", "--dtype", "fp64"],
         r"--dtype fp64: backend 'cpu' does not declare float64; "
         r"it declares: bfloat16 \(bf16\), float16 \(fp16, half\)$"),
        (["--backend", "cpu", "--dtype", "float32"],
         r"--dtype float32: backend 'cpu' does not declare float32; it declares: bfloat16"),
        (["--backend", "example", "--dtype", "fp16"],
         r"--dtype fp16: backend 'example' does not declare float16; "
         r"it declares: bfloat16 \(bf16\)$"),
        (["--backend", "cpu", "--dtype", "bfloat61"],
         r"--dtype bfloat61: unknown dtype name \(did you mean 'bfloat16'\?\); "
         r"backend 'cpu' declares"),
    ],
)  # fmt: skip
def test_cli_refuses_a_bad_selection_before_running_anything(
    args: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(pytest, "main", lambda argv: ran.append(argv) or 0)
    monkeypatch.chdir(tmp_path)
    if args[1] == "example" and "example" not in {b.name for b in ampcore.list_backends()}:
        pytest.skip("the example plugin is not installed")
    assert main(["conformance", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("ampcore conformance: error: --"), err
    assert re.search(expected, err.splitlines()[0].removeprefix("ampcore conformance: error: ")), err
    assert "fp32" not in err or "float32" in args  # fp32 is never offered as valid by the cpu backend
    assert ran == [] and list(tmp_path.iterdir()) == []  # no pytest run, no report folder


def test_cli_runs_pytest_for_a_known_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(pytest, "main", lambda argv: ran.append(argv) or 0)
    assert main(["conformance", "--backend", "cpu", "--dtype", "bf16", "--report-dir", str(tmp_path / "r")]) == 0
    assert ran and ran[0][ran[0].index("--ampcore-dtype") + 1] == "bf16"


def test_run_order_names_every_check_module() -> None:
    import ampcore_conformance
    from ampcore_conformance._session import MODULE_ORDER

    modules = {p.stem for p in Path(ampcore_conformance.__file__).parent.glob("test_*.py")}
    assert set(MODULE_ORDER) == modules and len(MODULE_ORDER) == len(modules)


def test_missing_features_skip_only_on_an_unexpected_keyword() -> None:
    from ampcore_conformance._checks import require_argument

    def old_api(**kwargs: object) -> None:
        raise TypeError("__init__() got an unexpected keyword argument 'custom_white_list'")

    def broken(**kwargs: object) -> None:
        raise TypeError("unsupported operand type(s)")

    with pytest.raises(pytest.skip.Exception, match="feature missing in ampcore .*: custom lists"):
        require_argument(old_api, "custom_white_list", "custom lists", custom_white_list=())
    with pytest.raises(TypeError, match="unsupported operand"):
        require_argument(broken, "custom_white_list", "custom lists", custom_white_list=())
    require_argument(lambda **kwargs: None, "custom_white_list", "custom lists", custom_white_list=())


# -- issue 28, rows 12 and 13: damaged files and tolerances that are no positive finite number


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("m.toml", "op_eps = nan", "op_eps = nan"),
        ("m.toml", "op_eps = inf", "op_eps = inf"),
        ("m.toml", "op_eps = -inf", "op_eps = -inf"),
        ("m.toml", "grad_rtol = 0", "grad_rtol = 0"),
        ("m.toml", "grad_rtol = 0.0", "grad_rtol = 0.0"),
        ("m.toml", 'grad_rtol = "0.1"', "grad_rtol = '0.1'"),
        ("m.toml", "grad_rtol = true", "grad_rtol = True"),
        ("m.toml", "grad_rtol = [0.1]", "grad_rtol = [0.1]"),
        ("m.json", '{"tolerances": {"grad_rtol": NaN}}', "grad_rtol = nan"),
        ("m.json", '{"tolerances": {"grad_rtol": Infinity}}', "grad_rtol = inf"),
        ("m.json", '{"tolerances": {"grad_rtol": 1e400}}', "grad_rtol = inf"),
        ("m.json", '{"tolerances": {"op_eps": 1' + "0" * 400 + "}}", "op_eps = <a number too large for a float>"),
        ("m.json", '{"tolerances": {"op_eps": null}}', "op_eps = None"),
    ],
)
def test_tolerances_must_be_positive_finite_numbers(tmp_path: Path, name: str, text: str, key: str) -> None:
    body = text if name.endswith(".json") else f"[tolerances]\n{text}\n"
    path = _write(tmp_path, name, body)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value).startswith(f"manifest {path} [tolerances]: {key}: expected a positive finite number")


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("m.toml", b"\xff\xfe[\x00s\x00k\x00i\x00p\x00]\x00", "is not UTF-8 text"),  # saved as UTF-16
        ("m.json", b"\xff\xfe{\x00}\x00", "is not UTF-8 text"),
        ("m.toml", b"\x00\x01\x02binary", "is not valid TOML"),
        ("m.json", b"[" * 100_000 + b"]" * 100_000, "is not valid JSON"),  # nested too deep to parse
        ("m.json", b"[1, 2]", "expected a table/object at the top level"),
        ("m.toml", b"x = " + b"[" * 5_000 + b"]" * 5_000, "m.toml"),
    ],
)
def test_damaged_manifests_are_a_manifest_error_naming_the_file(
    tmp_path: Path, name: str, data: bytes, words: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ManifestError, match=re.escape(words)) as info:
        load_manifest(path)
    assert str(path) in str(info.value)


def test_a_damaged_manifest_is_a_usage_error_exit_4(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "m.toml"
    path.write_bytes(b"\xff\xfe[\x00s\x00k\x00i\x00p\x00]\x00")
    run = subprocess.run(
        [sys.executable, "-m", "ampcore", "conformance", "--backend", "cpu", "--manifest", str(path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 4, output  # pytest's usage error, not an INTERNALERROR (3)
    assert "INTERNALERROR" not in output and f"manifest {path} is not UTF-8 text" in output
