"""Checked by mypy in CI (tox's lint environment), never run: public names resolve to their
real types through the namespaces' generated ``if TYPE_CHECKING:`` blocks, not to ``Any``.
``assert_type`` fails mypy on a mismatch, ``Any`` included."""

from pathlib import Path

import selfspec_lookup
from typing_extensions import assert_type

import selfspec
import selfspec.app
import selfspec.provisional
import selfspec.testing
from selfspec._engine.contract.loop import Decoder as _Decoder
from selfspec._engine.contract.types import Draft as _Draft
from selfspec._engine.contract.types import Verdict as _Verdict
from selfspec._engine.runner.weightformat import WeightFormat as _WeightFormat
from selfspec.testing._lossless import LosslessError as _LosslessError

assert_type(selfspec.Draft, type[_Draft])
assert_type(selfspec.Verdict, type[_Verdict])
assert_type(selfspec.Decoder, type[_Decoder])
assert_type(selfspec.WeightFormat, type[_WeightFormat])
assert_type(selfspec.weight_formats("draft"), dict[str, _WeightFormat])
assert_type(selfspec.provisional.cache_dir(), Path)
assert_type(selfspec.app.task_names(), list[str])
assert_type(selfspec.testing.LosslessError, type[_LosslessError])
assert_type(selfspec_lookup.Lookup, type[selfspec_lookup.Lookup])
