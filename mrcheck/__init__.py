"""mr-check: which tier covers a change, run it, or hand it over (README, "mr-check")."""
