"""What a plugin command receives: :class:`CommandContext`, a narrow view of the command line.

A plugin's commands (``selfspec_commands``) get it as ``ctx.obj`` (``@click.pass_obj``) in
place of the CLI's own :class:`~selfspec.app._cli.settings.Settings`, so a new CLI flag never
changes what a plugin sees. It gives the model, decoders for it, the plugin's options and the
weight layout, and nothing else; ``selfspec.app`` documents it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from selfspec._engine.contract.loop import Decoder
    from selfspec.app._cli.settings import Settings
    from selfspec.app._models import Loaded


class CommandContext:
    """The command line as a plugin command sees it, and nothing more (a new CLI flag never
    changes it).

    A plugin adds commands with the ``selfspec_commands`` hook ([hooks.md](docs/hooks.md));
    each is a ``click.Command`` that receives a ``CommandContext`` as ``ctx.obj``::

        @click.command("calibrate")
        @click.pass_obj
        def calibrate(command: CommandContext) -> None:
            loaded = command.load_model()  # the model the user chose, its tokenizer
            baseline = command.decoder(loaded, "vanilla")
            mine = command.decoder(loaded)  # the selected plugin with the user's -o options

    ``plugin``: the selected plugin's name; ``weight_layout``: the ``--weight-layout`` asked for
    (``"auto"`` when none). :meth:`load_model` loads the model the user chose (``--model``,
    ``--dtype``, ``--device``, ``--device-map``, ``--threads``); :meth:`decoder` builds a
    :class:`selfspec.Decoder` for it (always with the chosen weight layout and the model's
    tokenizer); :meth:`options` / :meth:`given_options` are the plugin's ``-o`` options. Where
    a command writes its output is its own option (``--out``), by default in the plugin's
    :class:`selfspec.ArtefactStore`.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @property
    def plugin(self) -> str:
        """The selected plugin's name (``--plugin``, or the ``--plugin-file`` module's)."""
        return self._settings.plugin_name

    @property
    def weight_layout(self) -> str:
        """The weight layout asked for (``auto``, ``model``, ``transposed``, ``packed``)."""
        return self._settings.weight_layout or "auto"

    def load_model(self) -> Loaded:
        """Set the thread count and load the chosen model (``--model``, ``--dtype``,
        ``--device``, ``--device-map``, ``--threads``): ``.model``, ``.tokenizer``, ``.chat``,
        ``.eos_token_ids`` (as :func:`selfspec.app.load_model` returns)."""
        return self._settings.load_model()

    def given_options(self) -> dict[str, str]:
        """The ``-o key=value`` pairs exactly as given (strings; nothing filled in)."""
        return self._settings.parsed_options()

    def options(self) -> dict[str, Any]:
        """Every option the selected plugin declares, validated, defaults filled in (loads the
        plugin, not the model). Raises :class:`selfspec.OptionError` on a bad value."""
        return self._settings.validate_plugin()

    def decoder(
        self, loaded: Loaded, plugin: str | None = None, options: dict[str, Any] | None = None
    ) -> Decoder:
        """A :class:`selfspec.Decoder` over ``loaded`` with the chosen weight layout: the selected
        plugin with the user's ``-o`` options when ``plugin`` is ``None``, else the named plugin
        (e.g. ``"vanilla"`` for a baseline) with ``options``; always the model's tokenizer."""
        if plugin is None and options is None:
            return self._settings.decoder(loaded)
        from selfspec._engine.contract.loop import Decoder

        if plugin is None:
            name, obj = self._settings.plugin_object()
        else:
            name, obj = plugin, None
        return Decoder(
            loaded.model,
            name,
            options or {},
            tokenizer=loaded.tokenizer,
            plugin_object=obj,
            weight_layout=self.weight_layout,
        )

    def __repr__(self) -> str:
        return f"CommandContext(plugin={self.plugin!r}, weight_layout={self.weight_layout!r})"
