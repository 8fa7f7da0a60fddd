"""Views: figures, tables, text, HTML reports, notebook widgets and magics, drawn from results that were
already measured. Nothing here measures."""
