"""Counterfactual replay: the discrete-step decode-fleet simulator and its event stream."""

from shadow.replay.engine import replay
from shadow.replay.records import InitialRequest, ReplayResult

__all__ = ["InitialRequest", "ReplayResult", "replay"]
