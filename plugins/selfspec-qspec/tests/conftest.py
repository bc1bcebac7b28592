"""Tiny models gain nothing from threads; on a busy machine extra threads oversubscribe the
cores and make every decode many times slower. Fixtures and Hypothesis profiles come from the
selfspec kit's pytest plugin."""

import torch

torch.set_num_threads(1)
