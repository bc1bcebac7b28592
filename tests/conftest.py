"""Host test-suite settings (fixtures and Hypothesis profiles come from ``selfspec.testing``)."""

import torch

# Tiny models gain nothing from threads, and on a busy 2-core machine two threads per process
# made decoding ~50x slower (oversubscription). One thread keeps the suite fast and stable.
torch.set_num_threads(1)
