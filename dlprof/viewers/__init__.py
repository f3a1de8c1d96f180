"""Views: render analysis results for a person; they compute nothing of their own."""
