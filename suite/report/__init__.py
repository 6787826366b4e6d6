"""Reading records into figures, pages and traces (nothing here measures)."""
