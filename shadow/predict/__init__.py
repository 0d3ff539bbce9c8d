"""Output-length predictors for BR-H (survival, exact match, oracle) and their calibration."""

from shadow.predict.calibration import Calibration, calibrate, prequential_calibrate, roc_auc
from shadow.predict.predictors import (
    PREDICTORS,
    ExactMatchPredictor,
    OraclePredictor,
    Prediction,
    Predictor,
    SurvivalPredictor,
    make_predictor,
)

__all__ = [
    "PREDICTORS",
    "Calibration",
    "ExactMatchPredictor",
    "OraclePredictor",
    "Prediction",
    "Predictor",
    "SurvivalPredictor",
    "calibrate",
    "make_predictor",
    "prequential_calibrate",
    "roc_auc",
]
