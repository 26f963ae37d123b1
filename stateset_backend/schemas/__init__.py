"""Generated JSON Schemas (spec, plan, result, contract), shipped as package data."""
