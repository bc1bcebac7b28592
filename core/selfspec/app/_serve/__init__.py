"""``specdec serve``: an OpenAI-compatible HTTP server over one model and one decoder.

``protocol`` checks request bodies, ``text`` turns committed ids into streamed text with stop
strings, ``worker`` owns the model and runs decodes one at a time on its own thread, ``app``
is the Starlette application, ``server`` binds, loads and runs uvicorn. ``docs/serve.md``
is the user's page. Starlette and uvicorn come with the ``serve`` extra.
"""

from __future__ import annotations
