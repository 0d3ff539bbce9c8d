"""BR-0's and BR-H's parameters (BALANCEROUTE.md), as plain data: apart from the policies
that use them, so that the policy registry can name the type its factories take without
importing the policies that register there."""

from __future__ import annotations

from dataclasses import dataclass

#: the most candidates an exact subset choice considers (Stage 2's `r_max` bound)
MAX_CANDIDATES = 24


@dataclass(frozen=True)
class BalanceRouteConfig:
    """Parameters of BR-H (and of the admission round BR-0 shares)."""

    horizon: int = 80
    alpha: float = 1.0
    beta: float = 43.0
    gamma: float = 0.86
    s_greedy: int = 7
    r_max: int = 4

    def __post_init__(self) -> None:
        problems = []
        if self.horizon < 0:
            problems.append(f"horizon must be >= 0, got {self.horizon}")
        if self.alpha < 0 or self.beta < 0:
            problems.append(f"alpha and beta must be >= 0, got {self.alpha}, {self.beta}")
        if not 0 < self.gamma <= 1:
            problems.append(f"gamma must be in (0, 1], got {self.gamma}")
        if self.s_greedy < 0:
            problems.append(f"s_greedy must be >= 0, got {self.s_greedy}")
        if not 1 <= self.r_max <= MAX_CANDIDATES:
            problems.append(f"r_max must be in 1..{MAX_CANDIDATES}, got {self.r_max}")
        if problems:
            raise ValueError("; ".join(problems))

    def coefficients(self, workers: int) -> tuple[float, float]:
        """`(alpha, beta)`; `H = 0` forces `(1, G)`, which makes BR-H exactly BR-0."""
        if self.horizon == 0:
            return 1.0, float(workers)
        return self.alpha, self.beta
