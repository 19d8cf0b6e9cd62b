"""A cache root that cannot hold the cache warns by name and the run goes on; two processes share one cache safely."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from tiny_tokenizer import make_tiny_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from medusa_lite import paths
from medusa_lite.artifacts import default_model
from medusa_lite.cpu import kernels

UNUSABLE_ROOTS = {
    "a file": lambda tmp_path: tmp_path / "cache-file",
    "a folder under a file": lambda tmp_path: tmp_path / "cache-file" / "medusa-lite",
}


@pytest.fixture
def fresh_process_cache(monkeypatch):
    """Each test starts with no fallback root and no warning given yet (both are per process)."""
    for cached in (paths.process_cache_root, paths.warn_unusable_root, kernels.loaded_library):
        cached.cache_clear()
    yield
    for cached in (paths.warn_unusable_root, kernels.loaded_library):
        cached.cache_clear()


def unusable_root(tmp_path, monkeypatch, kind: str):
    (tmp_path / "cache-file").write_text("not a folder")
    root = UNUSABLE_ROOTS[kind](tmp_path)
    monkeypatch.setenv(paths.CACHE_ENV_VAR, str(root))
    return root


def tiny_conversion(monkeypatch) -> list:
    """The GGUF conversion replaced by a tiny model's; returns the list of conversions made."""
    conversions = []
    tokenizer = make_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )

    def load_gguf_model():
        conversions.append(1)
        return LlamaForCausalLM(config).eval(), tokenizer

    monkeypatch.setattr(default_model, "load_gguf_model", load_gguf_model)
    monkeypatch.setattr(default_model, "to_plain_checkpoint", lambda model, dtype: model)
    return conversions


@pytest.mark.parametrize("kind", list(UNUSABLE_ROOTS))
def test_the_default_model_is_converted_into_a_temporary_folder_with_a_warning(
    kind, tmp_path, monkeypatch, fresh_process_cache
):
    root = unusable_root(tmp_path, monkeypatch, kind)
    conversions = tiny_conversion(monkeypatch)
    with pytest.warns(UserWarning, match=f"cannot write its cache into MEDUSA_LITE_CACHE={root}"):
        folder = default_model.ensure_default_model(torch.float32)
    assert folder.is_dir() and (folder / "config.json").is_file()
    assert folder.is_relative_to(paths.process_cache_root())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second use: no second warning, no second conversion
        assert default_model.ensure_default_model(torch.float32) == folder
    assert conversions == [1]


def test_a_usable_root_is_used_as_it_is(tmp_path, monkeypatch, fresh_process_cache):
    monkeypatch.setenv(paths.CACHE_ENV_VAR, str(tmp_path / "cache"))
    tiny_conversion(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folder = default_model.ensure_default_model(torch.float32)
    assert folder.parent == tmp_path / "cache"
    assert paths.process_cache_root.cache_info().currsize == 0, "no fallback made for a usable root"


def usable_variant() -> str | None:
    return next((v for v in kernels.VARIANT_FLAGS if kernels.cpu_runs(v) and kernels.compiler()), None)


@pytest.mark.skipif(usable_variant() is None, reason="no row_gemm variant builds on this CPU")
def test_the_kernel_is_built_into_a_temporary_folder_when_the_root_is_unusable(
    tmp_path, monkeypatch, fresh_process_cache
):
    root = unusable_root(tmp_path, monkeypatch, "a file")
    with pytest.warns(UserWarning, match=f"MEDUSA_LITE_CACHE={root}"):
        library = kernels.loaded_library(usable_variant())
    assert library.row_gemm_max_rows() > 0


BUILD_IN_A_PROCESS = (
    "import sys; from medusa_lite.cpu import kernels; "
    "lib = kernels.loaded_library(sys.argv[1]); print(kernels.library_path(sys.argv[1]), lib.row_gemm_max_rows())"
)


@pytest.mark.slow
@pytest.mark.skipif(usable_variant() is None, reason="no row_gemm variant builds on this CPU")
def test_two_processes_building_the_kernel_into_one_fresh_cache_both_load_it(tmp_path):
    environment = {"MEDUSA_LITE_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_IN_A_PROCESS, usable_variant()],
            env=os.environ | environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in results]
    built = sorted((tmp_path / "cache" / "kernels").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so", f"half-written or temporary entries left: {built}"
    assert all(out.split()[0] == str(built[0]) for out, _ in results)
