"""What the CUDA build consists of (legalpt/attention/build.py): targets, head dims, sources and the generated
instantiation files; and that a build without CUDA leaves the CPU paths whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from legalpt.attention import build


@pytest.mark.parametrize(("archs", "sm90"), [("80;90", True), ("90", True), ("80", False), ("80,86", False)], ids=str)
def test_hopper_builds_sm90a_with_the_fa3_kernels(monkeypatch, archs: str, sm90: bool):
    monkeypatch.setenv(build.ARCHS_ENV, archs)
    flags = build.nvcc_flags()
    assert ("-gencode=arch=compute_90a,code=sm_90a" in flags) == sm90
    assert not any(f.endswith("sm_90") for f in flags), "Hopper's target is sm_90a"
    assert ("-DLEGALPT_SM90" in flags) == sm90
    assert any("sm90_" in p.name for p in build.sources()) == sm90


def test_head_dims_choose_the_sources(monkeypatch):
    monkeypatch.setenv(build.HEAD_DIMS_ENV, "128,64")
    monkeypatch.setenv(build.ARCHS_ENV, "80")
    names = [p.name for p in build.sources()]
    assert names[0] == "api.cu" and "sm80_prepare.cu" in names
    kernels = [n for n in names if "_hdim" in n]
    assert {n.split("_")[2] for n in kernels} == {"hdim64", "hdim128"}
    assert len(kernels) == 2 * 2 * 2 * 2  # head dims x directions x element types x generality
    defines = [f for f in build.nvcc_flags() if f.startswith("-DLEGALPT_HDIM")]
    assert defines == ["-DLEGALPT_HDIM_64", "-DLEGALPT_HDIM_128"]
    assert all(p.is_file() for p in build.sources())


@pytest.mark.parametrize(("name", "value"), [("LEGALPT_CUDA_ARCHS", "sm_90"), ("LEGALPT_HEAD_DIMS", "48")])
def test_bad_build_settings_name_the_variable(monkeypatch, name: str, value: str):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        build.nvcc_flags()


def test_committed_instantiations_are_the_generators(tmp_path):
    """csrc/instantiations/ holds exactly what `python -m legalpt.attention.build` writes."""
    folder = build.source_root() / "instantiations"
    expected = build.instantiations()
    assert sorted(p.name for p in folder.glob("*.cu")) == sorted(expected)
    assert all((folder / name).read_text() == text for name, text in expected.items())
    (tmp_path / "instantiations").mkdir()
    (tmp_path / "instantiations" / "stale.cu").write_text("")
    written = build.write_instantiations(tmp_path)
    assert sorted(p.name for p in (tmp_path / "instantiations").iterdir()) == sorted(p.name for p in written)


def test_the_build_links_the_cxx_runtime_torch_loaded(tmp_path):
    """The extension must share torch's libstdc++ (a compiler linking its own copy statically turns every C++ check
    into a crash): the flag names the library this process mapped, and nothing where none is mapped, where the mapped
    file is gone, or where its path would split in a ninja file."""
    import torch  # noqa: F401  (maps libstdc++ into this process, as setup.py's import does)

    assert [Path(f).name.startswith("libstdc++.so") for f in build.runtime_link_flags()] == [True]
    library = tmp_path / "lib" / "libstdc++.so.6.0.33"
    library.parent.mkdir()
    library.write_bytes(b"")
    maps = tmp_path / "maps"

    def mapped(path: str) -> list[str]:
        maps.write_text(
            "7f00-7f10 r--p 00000000 fe:00 12  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7f10-7f20 rw-p 00000000 00:00 0 \n"
            f"7f20-7f30 r-xp 00002000 fe:00 34  {path}\n"
        )
        return build.runtime_link_flags(maps)

    assert mapped(str(library)) == [str(library)]
    assert mapped(f"{library} (deleted)") == []
    spaced = tmp_path / "my libs" / library.name
    spaced.parent.mkdir()
    spaced.write_bytes(b"")
    assert mapped(str(spaced)) == []
    maps.write_text("7f00-7f10 r--p 00000000 fe:00 12  /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert build.runtime_link_flags(maps) == []
    assert build.runtime_link_flags(tmp_path / "absent") == []
