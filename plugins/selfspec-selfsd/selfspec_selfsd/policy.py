"""The adaptive draft-exit threshold of Draft & Verify (§3.4, Algorithm 3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Threshold:
    """Draft-exit threshold gamma, updated after every verification.

    ``AR <- beta1*AR + (1-beta1)*AR_e`` (``beta1 = 0`` at the first stage), then
    ``gamma~ = gamma + epsilon`` if ``AR <= alpha`` else ``gamma - epsilon``, then
    ``gamma <- beta2*gamma + (1-beta2)*gamma~``. With ``adaptive=False`` gamma stays at
    ``gamma0`` (the paper's static threshold, Table 4).
    """

    gamma0: float = 0.6
    epsilon: float = 0.01
    beta1: float = 0.5
    beta2: float = 0.9
    alpha: float = 0.9
    adaptive: bool = True
    gamma: float = 0.6
    ar: float = 0.0
    stages: int = 0

    def reset(self) -> None:
        self.gamma, self.ar, self.stages = self.gamma0, 0.0, 0

    def update(self, drafted: int, accepted: int) -> float:
        """One verification stage with ``drafted`` draft tokens, ``accepted`` of them accepted.
        A stage without drafts leaves everything as it is. Returns the new gamma."""
        if drafted <= 0:
            return self.gamma
        ar_e = accepted / drafted
        beta1 = 0.0 if self.stages == 0 else self.beta1
        self.ar = beta1 * self.ar + (1.0 - beta1) * ar_e
        self.stages += 1
        if self.adaptive:
            target = (
                self.gamma + self.epsilon if self.ar <= self.alpha else self.gamma - self.epsilon
            )
            self.gamma = self.beta2 * self.gamma + (1.0 - self.beta2) * target
        return self.gamma
