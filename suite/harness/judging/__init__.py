"""How a comparison is judged: tolerances, known deviations and their signatures, failure messages, repros, findings."""
