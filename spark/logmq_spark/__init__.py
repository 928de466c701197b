"""logmq as a PySpark source and sink (Python Data Source API)."""
