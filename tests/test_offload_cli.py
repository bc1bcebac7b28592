"""``--device-map``, ``--max-memory`` and ``--offload-folder`` (and ``load_model``'s arguments):
a tiny model saved as safetensors, placed over CPU memory and disk by accelerate."""

from __future__ import annotations

import json

import pytest
from _tiny_models import save_tiny_llama
from click.testing import CliRunner

from selfspec import Decoder
from selfspec._engine.contract.reference import reference_generate
from selfspec.app import _models as models
from selfspec.app import load_model
from selfspec.app._cli import cli
from selfspec.app._models.placement import parse_max_memory, parse_size, placement_request

PROMPT = "the cat sat on a mat"
#: layers 1 and 3 and the LM head on disk, the rest in memory
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.layers.3": "disk",
    "model.norm": "cpu",
    "lm_head": "disk",
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("offload-cli") / "tiny", seed=1, layers=4)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_load_model_places_layers_as_asked_and_decodes_like_generate_there(model_dir, tmp_path):
    loaded = load_model(
        model_dir, dtype="float64", device_map=SPLIT, offload_folder=tmp_path / "off"
    )
    assert loaded.placement["layers"] == "0 cpu, 1 disk, 2 cpu, 3 disk"
    assert loaded.placement["offloaded_layers"] == 2 and str(loaded.device) == "cpu"
    ids = loaded.tokenizer.encode(PROMPT)
    for plugin in ("vanilla", "selfsd"):
        result = Decoder(loaded.model, plugin, audit=True).generate(ids, 12, ())
        assert result.output_ids == reference_generate(loaded.model, ids, 12)
        assert result.stats.placement["layers"] == "0 cpu, 1 disk, 2 cpu, 3 disk"


def test_max_memory_alone_means_auto_and_spills_to_disk(model_dir):
    # a layer is about 40 kB in float32: room for the embedding and a layer or two, the rest on disk
    loaded = load_model(model_dir, dtype="float32", max_memory="cpu=100KB")
    assert loaded.request.device_map == "auto"
    devices = loaded.placement["devices"]
    assert devices.get("cpu", 0) >= 1 and devices.get("disk", 0) >= 1, loaded.placement
    assert loaded.placement["offloaded_layers"] == devices["disk"]
    # nothing fits: all on disk
    whole = load_model(model_dir, dtype="float32", max_memory="cpu=1KB")
    assert whole.placement["devices"] == {"disk": 4} and whole.placement["layers"] == "0-3 disk"


def test_json_records_the_placement_and_stderr_says_it_once(model_dir, tmp_path):
    args = [
        "-m",
        model_dir,
        "--dtype",
        "float64",
        "-n",
        8,
        "--device-map",
        json.dumps(SPLIT),
        "--offload-folder",
        tmp_path / "off",
    ]
    r = invoke(*args, "--json", PROMPT)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["placement"]["device_map"] == SPLIT
    assert data["placement"]["placed"]["layers"] == "0 cpu, 1 disk, 2 cpu, 3 disk"
    assert data["stats"]["placement"]["offloaded_layers"] == 2
    loaded = models.load(model_dir, dtype="float64")
    assert data["output_ids"] == reference_generate(
        loaded.model, data["prompt_ids"], 8, loaded.eos_token_ids
    )
    streamed = invoke(*args, "-p", "lookup", PROMPT)
    assert streamed.exit_code == 0, streamed.output
    lines = [ln for ln in streamed.stderr.splitlines() if "placement:" in ln]
    assert lines == [
        "selfspec: placement: layers 0 cpu, 1 disk, 2 cpu, 3 disk; "
        "embed_tokens cpu, rotary_emb cpu, norm cpu, lm_head disk"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device-map", "everywhere"], "unknown device map 'everywhere'"),
        (["--device-map", "{oops"], "--device-map is not valid JSON"),
        (["--device-map", '["cpu"]'], "unknown device map"),
        (["--device-map", '{"lm_head": "tpu"}'], "unknown device 'tpu'"),
        (["--max-memory", "cpu"], "'cpu' is not DEVICE=SIZE"),
        (["--max-memory", "cpu=lots"], "'lots' is not a size"),
        (["--max-memory", "cpu=1GB,cpu=2GB"], "names 'cpu' twice"),
    ],
)
def test_bad_placement_values_are_one_line_errors(model_dir, args, message):
    r = invoke("-m", model_dir, *args, "-n", 2, PROMPT)
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_file_as_offload_folder_is_refused(model_dir, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = invoke("-m", model_dir, "--offload-folder", f, "-n", 2, PROMPT)
    assert r.exit_code == 2 and "is a file, not a directory" in r.stderr


def test_a_map_naming_a_missing_module_is_a_load_error(model_dir):
    r = invoke(
        "-m",
        model_dir,
        "--device-map",
        '{"model.nowhere": "cpu", "lm_head": "cpu"}',
        "-n",
        2,
        PROMPT,
    )
    assert r.exit_code == 1, r.output
    assert (
        "names modules" in r.stderr and "model.nowhere" in r.stderr and "Traceback" not in r.output
    )


def test_sizes_and_budgets_parse():
    assert (
        parse_size("6GiB") == 6 * 2**30
        and parse_size("500MB") == 500 * 10**6
        and parse_size("1024") == 1024
    )
    assert parse_max_memory("cpu=1GiB, disk=2GB,cuda:1=3GiB") == {
        "cpu": 2**30,
        "disk": 2 * 10**9,
        1: 3 * 2**30,
    }
    assert placement_request().device_map is None and placement_request().kwargs() == {}
    assert placement_request("balanced").kwargs() == {"device_map": "balanced"}
