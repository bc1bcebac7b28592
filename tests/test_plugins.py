"""Plugin discovery and loading: strict at load time, clear errors naming the plugin."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

import click
import pytest

import selfspec
from selfspec import Decoder, Option
from selfspec._engine.contract import manager, plugins
from selfspec._engine.contract.manager import make_manager
from selfspec._engine.contract.options import OptionError, parse_pairs, resolve
from selfspec._engine.contract.plugins import PluginError, UnknownPluginError, declared_options


class Proposer:
    @selfspec.hookimpl
    def selfspec_propose(self, state):
        return None


@pytest.fixture
def fake_installed(tmp_path, monkeypatch):
    """A third-party plugin 'fake' installed through the `selfspec` entry-point group."""
    (tmp_path / "selfspec_fake_mod.py").write_text(
        textwrap.dedent("""
        import selfspec

        class Fake:
            def __init__(self):
                self.proposed = 0

            @selfspec.hookimpl
            def selfspec_options(self, register):
                register(selfspec.Option("width", int, 2, "how wide", min=1, max=8))

            @selfspec.hookimpl
            def selfspec_propose(self, state):
                self.proposed += 1
                return None
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = [
        metadata.EntryPoint(name="fake", value="selfspec_fake_mod:Fake", group="selfspec"),
        metadata.EntryPoint(name="broken", value="selfspec_no_such_module:X", group="selfspec"),
    ]
    real = metadata.entry_points

    class FakeMetadata:
        @staticmethod
        def entry_points(group=None, **kw):
            eps = list(real(group=group, **kw)) if group else []
            return eps + [ep for ep in fake if ep.group == group]

    monkeypatch.setattr(plugins, "metadata", FakeMetadata)
    yield
    sys.modules.pop("selfspec_fake_mod", None)


def test_plugin_is_installed(pytestconfig):
    """The kit is registered as a pytest plugin through the `pytest11` entry point."""
    assert pytestconfig.pluginmanager.hasplugin("selfspec")


def test_available_lists_vanilla_first_without_importing():
    found = plugins.available()
    assert next(iter(found)) == "vanilla"
    assert found["vanilla"].version == selfspec.__version__


def test_third_party_plugin_via_entry_point(fake_installed, tiny_model_factory):
    found = plugins.available()
    assert "fake" in found and found["fake"].value == "selfspec_fake_mod:Fake"
    assert "selfspec_fake_mod" not in sys.modules  # listing imports nothing
    pm, instance = make_manager("fake")
    assert type(instance).__name__ == "Fake"
    assert plugins.hook_names(pm, instance) == ["selfspec_options", "selfspec_propose"]
    dec = Decoder(tiny_model_factory("llama"), "fake", {"width": "3"})
    dec.generate([1, 2, 3], 4, eos_token_ids=())
    assert dec.plugin.proposed == 4 and dec.options == {"width": 3}
    info = manager.describe("fake")
    assert info["name"] == "fake" and "selfspec_propose" in info["hooks"]
    assert info["options"][0]["name"] == "width"


def test_plugin_that_fails_to_import(fake_installed):
    with pytest.raises(PluginError, match=r"'broken'.*failed to import selfspec_no_such_module:X"):
        make_manager("broken")


def test_unknown_plugin_lists_installed(fake_installed):
    with pytest.raises(UnknownPluginError) as err:
        make_manager("nosuch")
    msg = str(err.value)
    assert "'nosuch'" in msg and "not installed" in msg and "vanilla" in msg and "fake" in msg


def test_blocked_plugins(fake_installed, monkeypatch):
    monkeypatch.setenv("SELFSPEC_BLOCK_PLUGINS", "other, fake")
    with pytest.raises(PluginError, match=r"'fake'.*blocked by SELFSPEC_BLOCK_PLUGINS"):
        make_manager("fake")
    with pytest.raises(PluginError, match="blocked"):
        make_manager("fake", plugin_object=Proposer)
    make_manager("vanilla")  # others still load


def test_misspelled_hook_is_an_error_at_load_time():
    class Typo:
        @selfspec.hookimpl
        def selfspec_propse(self, state):
            return None

    with pytest.raises(PluginError, match=r"(?s)'typo'.*selfspec_propse"):
        make_manager("typo", plugin_object=Typo)

    class UnmarkedTypo:  # not even marked: the selfspec_ prefix is enough
        def selfspec_verfy(self, state, draft):
            return None

    with pytest.raises(PluginError, match="selfspec_verfy"):
        make_manager("unmarked", plugin_object=UnmarkedTypo)


def test_argument_not_in_the_spec_is_an_error():
    class Extra:
        @selfspec.hookimpl
        def selfspec_propose(self, state, budget):
            return None

    with pytest.raises(PluginError, match=r"(?s)'extra'.*budget.*not be found in the hookspec"):
        make_manager("extra", plugin_object=Extra)


def test_subset_of_arguments_is_fine():
    class Subset:
        @selfspec.hookimpl
        def selfspec_verify(self, draft):
            return None

    make_manager("subset", plugin_object=Subset)


def test_plugin_with_no_hooks_is_an_error():
    class Nothing:
        def helper(self):
            pass

    with pytest.raises(PluginError, match=r"'nothing'.*implements no selfspec hook"):
        make_manager("nothing", plugin_object=Nothing)


def test_module_plugins_and_plugin_files(tmp_path, tiny_model_factory):
    path = tmp_path / "myplug.py"
    path.write_text(
        textwrap.dedent("""
        import selfspec

        calls = []

        @selfspec.hookimpl
        def selfspec_start(state):
            calls.append(state.prompt_length)
    """)
    )
    name, module = plugins.load_file(path)
    assert name == "myplug"
    Decoder(tiny_model_factory("llama"), name, plugin_object=module).generate(
        [1, 2], 2, eos_token_ids=()
    )
    assert module.calls == [2]
    with pytest.raises(PluginError, match="does not exist"):
        plugins.load_file(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("raise ImportError('no numpy here')\n")
    with pytest.raises(PluginError, match="no numpy here"):
        plugins.load_file(bad)


def test_hook_options():
    class Opts:
        @selfspec.hookimpl
        def selfspec_options(self, register):
            register(Option("k", int, 4, "draft length", min=1, max=16))
            register(Option("mode", str, "fast", "how", choices=("fast", "slow")))
            register(Option("adapt", bool, True, "adapt k"))
            register(Option("threshold", float, None, "exit threshold", min=0.0, max=1.0))

        @selfspec.hookimpl
        def selfspec_propose(self, state):
            return None

    pm, _ = make_manager("opts", plugin_object=Opts)
    declared = declared_options(pm)
    assert list(declared) == ["k", "mode", "adapt", "threshold"]
    assert resolve(declared, {}, "opts") == {
        "k": 4,
        "mode": "fast",
        "adapt": True,
        "threshold": None,
    }
    got = resolve(declared, parse_pairs(["k=7", "mode=slow", "adapt=no", "threshold=0.5"]), "opts")
    assert got == {"k": 7, "mode": "slow", "adapt": False, "threshold": 0.5}
    with pytest.raises(
        OptionError,
        match=r"plugin 'opts' has no option 'kk' \(its options: adapt, k, mode, threshold\)",
    ):
        resolve(declared, {"kk": "1"}, "opts")
    for bad, message in [
        ({"k": "x"}, "not a valid int"),
        ({"k": "0"}, "below the minimum"),
        ({"k": 17}, "above the maximum"),
        ({"mode": "medium"}, "not one of"),
        ({"adapt": "maybe"}, "not a boolean"),
        ({"k": True}, "expected int"),
    ]:
        with pytest.raises(OptionError, match=f"option '{next(iter(bad))}': .*{message}"):
            resolve(declared, bad, "opts")
    with pytest.raises(OptionError, match="key=value"):
        parse_pairs(["k"])


def test_options_through_the_decoder(tiny_model_factory):
    class Opts:
        @selfspec.hookimpl
        def selfspec_options(self, register):
            register(Option("k", int, 4, "draft length", min=1))

    model = tiny_model_factory("llama")
    assert Decoder(model, "opts", {"k": "2"}, plugin_object=Opts).options == {"k": 2}
    with pytest.raises(OptionError, match="no option 'depth'"):
        Decoder(model, "opts", {"depth": 2}, plugin_object=Opts)
    with pytest.raises(OptionError, match="no option 'k'"):
        Decoder(model, "vanilla", {"k": 2})


def test_option_declared_twice_is_an_error():
    class Twice:
        @selfspec.hookimpl
        def selfspec_options(self, register):
            register(Option("k", int, 1, "a"))
            register(Option("k", int, 2, "b"))

    pm, _ = make_manager("twice", plugin_object=Twice)
    with pytest.raises(PluginError, match=r"'twice'.*option 'k' is declared twice"):
        declared_options(pm)

    class NotAnOption:
        @selfspec.hookimpl
        def selfspec_options(self, register):
            register({"name": "k"})

    pm, _ = make_manager("nao", plugin_object=NotAnOption)
    with pytest.raises(PluginError, match="not a selfspec.Option"):
        declared_options(pm)


def test_malformed_option_declarations():
    with pytest.raises(TypeError):
        Option("k", list, None, "x")
    with pytest.raises(ValueError, match="identifier"):
        Option("not valid", int, 1, "x")
    with pytest.raises(OptionError, match="below the minimum"):
        Option("k", int, 0, "x", min=1)  # a default must be valid


def test_hook_commands():
    @click.command("tune")
    def tune() -> None:
        """Tune the plugin."""

    class Commands:
        @selfspec.hookimpl
        def selfspec_commands(self, register):
            register(tune)

    pm, _ = make_manager("cmds", plugin_object=Commands)
    got = []
    pm.hook.selfspec_commands(register=got.append)
    assert got == [tune]


def test_trace_env_enables_tracing(monkeypatch, capsys):
    monkeypatch.setenv("SELFSPEC_TRACE", "1")
    pm, _ = make_manager("vanilla")
    pm.hook.selfspec_options(register=lambda opt: None)
    assert "selfspec_options" in capsys.readouterr().err
    monkeypatch.delenv("SELFSPEC_TRACE")
    pm, _ = make_manager("vanilla")
    pm.hook.selfspec_options(register=lambda opt: None)
    assert "selfspec_options" not in capsys.readouterr().err


def test_managers_are_independent():
    pm1, p1 = make_manager("a", plugin_object=Proposer)
    pm2, p2 = make_manager("b", plugin_object=Proposer)
    assert pm1 is not pm2 and p1 is not p2
    assert pm1.get_plugin("b") is None
