"""Export: OTLP metrics, the report and its views, JSON."""
