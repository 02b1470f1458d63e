"""Quantized weights (issue 27): formats.py holds the formats and QuantLinear."""
