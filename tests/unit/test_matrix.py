"""matrix.toml: valid documents -> combinations, invalid ones -> every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.errors import ConfigError, InputError
from envbuilder.resolve.matrix import DEFAULT_RUNNER, Matrix, load_matrix, parse_matrix

REPO = Path(__file__).resolve().parents[2]
PATH = Path("m.toml")


def parse(text: str, environ: dict[str, str] | None = None) -> Matrix:
    return parse_matrix(text.encode(), path=PATH, environ=environ or {})


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text, environ)
    assert info.value.return_code == 2
    return info.value.problems


PAIR = """
[axes]
python = ["3.10", "3.11"]
[[pairs]]
torch = "2.4.1"
xformers = "0.0.28.post1"
cuda = "cu121"
"""


@pytest.mark.parametrize(
    ("document", "ids"),
    [
        pytest.param(
            PAIR,
            [
                "py3.10-cu121-torch2.4.1-xformers0.0.28.post1",
                "py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
            ],
            id="pair-expands-over-python-axis",
        ),
        pytest.param(
            '[axes]\npython = ["3.11", "3.12"]\n'
            '[[pairs]]\ntorch = "2.5.1"\nxformers = "0.0.28.post3"\ncuda = ["12.1", "cu124"]\n',
            [
                "py3.11-cu121-torch2.5.1-xformers0.0.28.post3",
                "py3.12-cu121-torch2.5.1-xformers0.0.28.post3",
                "py3.11-cu124-torch2.5.1-xformers0.0.28.post3",
                "py3.12-cu124-torch2.5.1-xformers0.0.28.post3",
            ],
            id="cuda-list-and-dotted-spelling",
        ),
        pytest.param(
            '[axes]\npython = ["3.10", "3.11", "3.12"]\n'
            '[[pairs]]\ntorch = "2.11.0"\ncuda = "13.0"\npython = ["3.12"]\n',
            ["py3.12-cu130-torch2.11.0"],
            id="python-subset-and-torch-alone",
        ),
        pytest.param(
            '[[combinations]]\npython = "3.12"\ncuda = "cu130"\ntorch = "2.11.0"\n'
            'xformers = "0.0.35"\nadd-cuda-runtime = true\n',
            ["py3.12-cu130-torch2.11.0-xformers0.0.35-cudart"],
            id="cudart-suffix",
        ),
        pytest.param(
            '[[combinations]]\npython = "3.11"\ntorch = "2.13.0"\ncuda = "cpu"\n'
            '[[combinations]]\npython = "3.11"\ntorch = "2.4.1"\n',
            ["py3.11-cpu-torch2.13.0", "py3.11-default-torch2.4.1"],
            id="cpu-and-default-cuda",
        ),
        pytest.param(
            PAIR + '[[exclude]]\npython = "3.1?"\ntorch = "2.4.*"\ncuda = "12.1"\n'
            '[[combinations]]\npython = "3.10"\ncuda = "cu121"\ntorch = "2.4.1"\n',
            ["py3.10-cu121-torch2.4.1"],
            id="exclude-globs-then-explicit-rows",
        ),
        pytest.param(
            PAIR + '[[exclude]]\npython = ["3.10"]\n',
            ["py3.11-cu121-torch2.4.1-xformers0.0.28.post1"],
            id="exclude-list",
        ),
        # rows for two platforms: the versions alone would give both rows one id
        pytest.param(
            '[axes]\npython = ["3.11"]\n'
            '[[pairs]]\ntorch = "2.4.1"\ncuda = "cu121"\n'
            '[[pairs]]\ntorch = "2.4.1"\ncuda = "cu121"\nplatform = "manylinux_2_28_aarch64"\n',
            [
                "py3.11-cu121-manylinux_2_28_x86_64-torch2.4.1",
                "py3.11-cu121-manylinux_2_28_aarch64-torch2.4.1",
            ],
            id="platform-in-ids-of-a-matrix-of-two-platforms",
        ),
    ],
)
def test_valid_documents_expand_to_ids_in_order(document: str, ids: list[str]) -> None:
    assert list(parse(document).ids) == ids


def test_defaults_fill_rows_and_row_keys_override_them() -> None:
    m = parse(
        '[defaults]\nplatform = "manylinux_2_17_x86_64"\nbase-image = "img:{python}-{cuda}"\n'
        '[[combinations]]\npython = "3.11"\ncuda = "12.4"\ntorch = "2.5.1"\nnote = "n"\n'
        '[[combinations]]\npython = "3.12"\ncuda = "12.4"\ntorch = "2.5.1"\n'
        'platform = "manylinux_2_28_x86_64"\nbase-image = "other"\n'
    )
    first, second = m.combinations
    assert (first.platform, first.base_image, first.note) == (
        "manylinux_2_17_x86_64",
        "img:3.11-cu124",
        "n",
    )
    assert (second.platform, second.base_image) == ("manylinux_2_28_x86_64", "other")
    assert m.defaults.platform == "manylinux_2_17_x86_64"


def test_default_index_is_the_users_pip_index() -> None:
    m = parse(PAIR)
    assert m.indexes["default"].url is None
    assert all(c.torch_index == c.xformers_index == "default" for c in m.combinations)


def test_index_serves_its_projects_and_the_default_index_the_rest() -> None:
    m = parse(
        '[indexes.pytorch]\nurl = "${BASE}/{cuda}"\nprojects = ["torch", "Triton"]\n'
        '[[combinations]]\npython = "3.11"\ncuda = "cu121"\ntorch = "2.4.1"\n'
        'xformers = "0.0.28.post1"\nindex = "pytorch"\n',
        environ={"BASE": "https://mirror.example/whl"},
    )
    spec = m.indexes["pytorch"]
    assert spec.url == "https://mirror.example/whl/{cuda}"
    assert spec.projects == ("torch", "triton")
    assert spec.url_for("cu121") == "https://mirror.example/whl/cu121"
    (c,) = m.combinations
    assert (c.torch_index, c.xformers_index) == ("pytorch", "default")


ENV_DOC = (
    '[indexes.pytorch]\nurl = "${PYTORCH_INDEX_URL}/{cuda}"\n'
    '[[combinations]]\npython = "3.11"\ncuda = "cu121"\ntorch = "2.4.1"\nindex = "pytorch"\n'
    '[[combinations]]\npython = "3.11"\ncuda = "cu121"\ntorch = "2.5.1"\n'
)


def test_an_unset_variable_is_an_error_only_for_fetching_from_its_index() -> None:
    m = parse(ENV_DOC)
    # Selecting (matrix, build, conformance) needs no index URL.
    assert [c.id for c in m.select([])] == ["py3.11-cu121-torch2.4.1", "py3.11-cu121-torch2.5.1"]
    m.require_index_urls(m.select(["torch2.5"]))
    # Fetching (resolve) names the variable, the index and who uses it.
    with pytest.raises(ConfigError) as info:
        m.require_index_urls(m.select(["torch2.4"]))
    assert info.value.problems == [
        "indexes.pytorch.url: environment variable(s) PYTORCH_INDEX_URL not set, and"
        " py3.11-cu121-torch2.4.1 use(s) index 'pytorch' to fetch from; set it or select"
        " other combinations"
    ]


def test_the_default_matrix_selects_without_the_pytorch_index_url() -> None:
    text = (REPO / "matrix.toml").read_text(encoding="utf-8")
    text = text.replace("# [indexes.pytorch]", "[indexes.pytorch]")
    text = text.replace('# url = "${PYTORCH_INDEX_URL}', 'url = "${PYTORCH_INDEX_URL}')
    text = text.replace('# projects = ["torch", "triton"]', 'projects = ["torch", "triton"]')
    text = text.replace('cuda = "cu121"\n', 'cuda = "cu121"\nindex = "pytorch"\n', 1)
    m = parse(text)
    assert m.unset_variables == {"pytorch": ("PYTORCH_INDEX_URL",)}
    chosen = m.select(["cu121"])
    assert chosen and all(c.torch_index == "pytorch" for c in chosen)
    with pytest.raises(ConfigError, match="PYTORCH_INDEX_URL not set"):
        m.require_index_urls(chosen)


SUITE_ROW = '[[combinations]]\npython = "3.11"\ntorch = "2.4.1"\n'


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        pytest.param("", (), id="absent-no-group"),
        pytest.param("[suite]\nrequirements = []\n", (), id="empty-no-group"),
        pytest.param(
            '[suite]\nrequirements = ["diffusers==0.42.1", "Pillow>=10; python_version < \'3.12\'"]\n',
            ("diffusers==0.42.1", 'Pillow>=10; python_version < "3.12"'),
            id="pinned-and-marked",
        ),
        pytest.param('[suite]\nrequirements = "diffusers"\n', ("diffusers",), id="one-string"),
        pytest.param(
            "[suite]\nrequirements = [\"x==2; python_version >= '3.11'\","
            " \"x==1; python_version < '3.11'\"]\n",
            ('x==2; python_version >= "3.11"', 'x==1; python_version < "3.11"'),
            id="a-release-per-python",
        ),
    ],
)
def test_suite_requirements(table: str, expected: tuple[str, ...]) -> None:
    assert parse(SUITE_ROW + table).suite.requirements == expected


def test_bad_suite_requirements_are_each_reported() -> None:
    found = problems(
        SUITE_ROW + "[suite]\nrequirments = []\nrequirements = ["
        '"diffusers==0.42.1", "Diffusers>=0.1", "torch==2.4.1",'
        ' "x @ https://example.invalid/x.whl", "diffusers==", 3]\n'
    )
    assert found[:5] == [
        "suite.requirments: unknown key 'requirments'; did you mean 'requirements'?",
        "suite.requirements[5]: expected a string, got integer 3",
        "suite.requirements[1]: 'Diffusers>=0.1' names diffusers again (after"
        " 'diffusers==0.42.1'); to pick a release per Python, give each a marker"
        " (e.g. \"; python_version < '3.11'\")",
        "suite.requirements[2]: 'torch==2.4.1' names torch, which each combination pins"
        " itself; the suite group is locked against it: remove it",
        "suite.requirements[3]: 'x @ https://example.invalid/x.whl' is a direct reference;"
        " the suite group is locked from the indexes: name a version instead"
        " (e.g. 'x==1.2.3')",
    ]
    assert found[5].startswith("suite.requirements[4]: invalid requirement 'diffusers==' (")
    assert len(found) == 6


def test_an_empty_variable_counts_as_unset() -> None:
    """A workflow hands an unset repository variable over as "": the index is then unusable,
    but a matrix that declares it and does not select its rows still loads."""
    m = parse(ENV_DOC, environ={"PYTORCH_INDEX_URL": ""})
    chosen = m.select(["torch2.5"])
    assert [c.id for c in chosen] == ["py3.11-cu121-torch2.5.1"]
    m.require_index_urls(chosen)
    with pytest.raises(ConfigError, match=r"PYTORCH_INDEX_URL.* not set"):
        m.require_index_urls(m.select(["torch2.4"]))


def test_runners_per_cuda_with_a_default() -> None:
    m = parse(
        PAIR + '[[combinations]]\npython = "3.12"\ncuda = "13.0"\ntorch = "2.11.0"\n'
        '[runners]\n[runners.cuda]\n"13.0" = ["gpu", "driver-580"]\n[runners.gpus]\nh100 = ["h100"]\n'
    )
    assert [c.runner for c in m.combinations] == [
        DEFAULT_RUNNER,
        DEFAULT_RUNNER,
        ("gpu", "driver-580"),
    ]
    assert m.runners.gpus == {"h100": ("h100",)}


def test_sha256_is_of_the_file_bytes(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "matrix.toml"
    path.write_text(PAIR, encoding="utf-8")
    m = load_matrix(path, environ={})
    assert m.sha256 == hashlib.sha256(PAIR.encode()).hexdigest()
    assert m.path == path


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_matrix(tmp_path / "nope.toml", environ={})


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            '[axes]\npython = ["3.11"]\n[[pairs]]\ntorch = 2.4.1\nxformers = "0.0.30"\n',
            [
                "m.toml:4:12: TOML syntax error: Expected newline or end of document after a statement"
            ],
            id="toml-syntax-line-col",
        ),
        pytest.param(
            PAIR + '[[pairs]]\ntorch = "2.5.1"\nxfromers = "0.0.28.post3"\n'
            "[defualts]\n[runners]\ndefault = 1\n",
            [
                "defualts: unknown key 'defualts'; did you mean 'defaults'?",
                "runners.default: expected a string or an array of strings, got integer 1",
                "pairs[1].xfromers: unknown key 'xfromers'; did you mean 'xformers'?",
            ],
            id="unknown-keys-and-types-all-at-once",
        ),
        pytest.param(
            '[axes]\npython = [3.10, "py3.11", "3.12"]\n'
            '[[pairs]]\ntorch = "2.4.one"\nxformers = "0.0.28+cu121"\ncuda = "cuda12"\n',
            [
                'axes.python[0]: expected a string, got float 3.1 (quote versions in TOML: "3.10", not 3.10)',
                "axes.python[1]: invalid Python version 'py3.11'; write it as '3.N', e.g. '3.11'",
                "pairs[0].cuda: invalid CUDA 'cuda12'; write 'cu121' or '12.1', 'cpu', or 'default' (whatever build the index has)",
                "pairs[0].torch: invalid version '2.4.one' (not a PEP 440 version)",
                "pairs[0].xformers: version '0.0.28+cu121' has a local label; drop '+cu121' and set cuda instead",
            ],
            id="bad-values",
        ),
        pytest.param(
            '[defaults]\nplatform = "manylinux_x86_64"\nindex = "pytroch"\n'
            '[indexes.pytorch]\nurl = "https://example.invalid/{cuda}"\n'
            '[[combinations]]\npython = "3.11"\ntorch = "2.4.1"\nindex = "pytorch"\n'
            '[[combinations]]\npython = "3.11"\ncuda = "cpu"\ntorch = "2.4.1"\nadd-cuda-runtime = true\n',
            [
                "defaults.platform: invalid platform tag 'manylinux_x86_64'; expected e.g. 'manylinux_2_28_x86_64'",
                "defaults.index: unknown index 'pytroch'; did you mean 'pytorch'?",
                "combinations[1]: cuda = 'cpu' with add-cuda-runtime = true: a CPU build has no CUDA runtime to add",
                "combinations[0]: uses index 'pytorch', whose URL has {cuda}, with cuda = 'default';"
                " set a CUDA (e.g. 'cu121') or use an index without {cuda}",
            ],
            id="platform-index-contradictions",
        ),
        pytest.param(
            '[[combinations]]\npython = "3.11"\ntorch = "2.4.1"\nplatform = "macosx_14_0_universal2"\n',
            [
                "combinations[0].platform: unsupported target platform 'macosx_14_0_universal2': "
                "a target is one machine's tag (manylinux_X_Y_ARCH, manylinux1/2010/2014_ARCH, "
                "linux_ARCH, musllinux_X_Y_ARCH, macosx_X_Y_arm64, macosx_X_Y_x86_64, win_amd64, "
                "win_arm64, win32)",
            ],
            id="a-fat-macos-tag-is-no-target",
        ),
        pytest.param(
            PAIR + '[[combinations]]\npython = "3.11"\ncuda = "12.1"\ntorch = "2.4.1"\n'
            'xformers = "0.0.28.post1"\n',
            [
                "duplicate combination id 'py3.11-cu121-torch2.4.1-xformers0.0.28.post1':"
                " pairs[0] (python 3.11, cuda cu121) and combinations[0] collide",
            ],
            id="duplicate-ids-name-both-entries",
        ),
        pytest.param(
            PAIR + '[[exclude]]\npython = "3.9"\n[[exclude]]\n',
            [
                "exclude[0]: matches no combination expanded from [[pairs]] (python = '3.9');"
                " fix the rule or remove it",
                "exclude[1]: has no rule; set any of python, cuda, torch, xformers",
            ],
            id="exclude-matching-nothing",
        ),
        pytest.param(
            '[axes]\npython = ["3.11"]\n[[pairs]]\nxformers = "0.0.30"\npython = ["3.12"]\n'
            '[[combinations]]\ncuda = "cu121"\ntorch = "2.4.1"\n'
            '[indexes.mirror]\nprojects = ["torch"]\n',
            [
                "indexes.mirror: has no url; only the 'default' index may omit it",
                "pairs[0].python[0]: '3.12' is not in axes.python ['3.11']; add it there or drop it here",
                "pairs[0]: missing key 'torch'",
                "combinations[0]: missing key 'python'",
            ],
            id="missing-keys",
        ),
        pytest.param(
            '[indexes.x]\nurl = "https://example.invalid/{cude}"\n[indexes.y]\nurl = "ftp://host"\n'
            '[[combinations]]\npython = "3.11"\ntorch = "2.4.1"\ntorch-index = "x"\n',
            [
                "indexes.x.url: unknown placeholder(s) cude in 'https://example.invalid/{cude}';"
                " only {cuda} is allowed (and ${VAR} for environment variables)",
                "indexes.y.url: URL 'ftp://host' must start with http://, https:// or file://",
            ],
            id="index-urls",
        ),
        pytest.param(
            "",
            ["declares no combinations; add [[pairs]] or [[combinations]]"],
            id="empty",
        ),
    ],
)
def test_invalid_documents_report_every_problem(document: str, expected: list[str]) -> None:
    assert problems(document) == expected


def test_config_error_message_lists_problems_under_the_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse('[[pairs]]\ntorch = "x"\n[[pairs]]\ntorch = "y"\n[axes]\npython = ["3.11"]\n')
    assert str(info.value).startswith("m.toml: 2 problem(s):\n  - pairs[0].torch")


# --- the repository's default matrix ------------------------------------------------

REQUIRED_IDS = [
    "py3.11-cu121-torch2.4.1-xformers0.0.28.post1",
    "py3.11-default-torch2.4.1-xformers0.0.28.post1",
    "py3.11-cu124-torch2.6.0-xformers0.0.26.post1",
    "py3.12-cu130-torch2.11.0-xformers0.0.35",
    "py3.12-cu130-torch2.11.0-xformers0.0.35-cudart",
]


@pytest.fixture(scope="module")
def default_matrix() -> Matrix:
    return load_matrix(REPO / "matrix.toml", environ={})


def test_default_matrix_pins_the_suite_s_own_dependencies(default_matrix: Matrix) -> None:
    assert default_matrix.suite.requirements == (
        'diffusers==0.42.1; python_version >= "3.11"',
        'diffusers==0.41.0; python_version < "3.11"',
    )


def test_default_matrix_has_the_required_rows_and_unique_ids(default_matrix: Matrix) -> None:
    ids = default_matrix.ids
    assert len(ids) == len(set(ids))
    assert set(REQUIRED_IDS) <= set(ids)


def test_default_matrix_notes_the_rows_expected_unsatisfiable(default_matrix: Matrix) -> None:
    by_id = default_matrix.by_id()
    assert "unsatisfiable" in by_id["py3.11-cu124-torch2.6.0-xformers0.0.26.post1"].note


def test_default_matrix_builds_xformers_0_0_35_from_source_for_cuda_13(
    default_matrix: Matrix,
) -> None:
    by_id = default_matrix.by_id()
    built = by_id["py3.12-cu130-torch2.11.0-xformers0.0.35"]
    assert (built.xformers_source, built.cuda_archs) == ("when-no-wheel-fits", ("9.0",))
    assert "built from source" in built.note
    # the CUDA 12 runtime row stays for comparison
    assert by_id["py3.12-cu130-torch2.11.0-xformers0.0.35-cudart"].xformers_source == "never"


def test_default_matrix_covers_pythons_and_cudas(default_matrix: Matrix) -> None:
    combos = default_matrix.combinations
    assert {c.python for c in combos} == {"3.10", "3.11", "3.12", "3.13"}
    assert {str(c.cuda) for c in combos} >= {"cu121", "cu124", "cu126", "cu128", "cu130"}
    torches = {c.torch for c in combos}
    assert {"2.4.1", "2.11.0"} <= torches
    # no cp313 wheel for torch 2.4.1, nor for xformers <= 0.0.30
    assert not [c.id for c in combos if c.python == "3.13" and c.torch == "2.4.1"]


def test_the_matrix_command_plans_jobs_without_the_index_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from envbuilder import cli

    monkeypatch.delenv("PYTORCH_INDEX_URL", raising=False)
    path = tmp_path / "matrix.toml"
    path.write_text(ENV_DOC, encoding="utf-8")
    assert cli.main(["matrix", "--matrix", str(path), "--format", "ids"]) == 0
    assert capsys.readouterr().out.split() == ["py3.11-cu121-torch2.4.1", "py3.11-cu121-torch2.5.1"]


def test_linux_windows_macos_and_musllinux_rows_load_together() -> None:
    """No platform refuses the matrix: each row is resolved, or answered, for its own tag."""
    rows = "".join(
        f'[[combinations]]\npython = "3.11"\ncuda = "{cuda}"\ntorch = "2.5.1"\n'
        f'platform = "{platform}"\n'
        for platform, cuda in (
            ("manylinux_2_28_x86_64", "cu121"),
            ("win_amd64", "cu121"),
            ("macosx_14_0_arm64", "cpu"),
            ("musllinux_1_2_x86_64", "cpu"),
        )
    )
    matrix = parse(rows)
    assert [c.id for c in matrix.combinations] == [
        "py3.11-cu121-manylinux_2_28_x86_64-torch2.5.1",
        "py3.11-cu121-win_amd64-torch2.5.1",
        "py3.11-cpu-macosx_14_0_arm64-torch2.5.1",
        "py3.11-cpu-musllinux_1_2_x86_64-torch2.5.1",
    ]
