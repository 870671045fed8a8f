"""What proposes tokens for the target to verify: the seam (`base`), prompt lookup (`ngram`), and a
draft model or the target's own first layers (`model`)."""
