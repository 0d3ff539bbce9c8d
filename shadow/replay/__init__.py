"""Counterfactual replay: the discrete-step decode-fleet simulator and its event stream."""

from shadow.replay.engine import InitialRequest, ReplayResult, replay

__all__ = ["InitialRequest", "ReplayResult", "replay"]
