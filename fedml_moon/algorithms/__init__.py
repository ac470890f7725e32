"""Each algorithm in one file: a party side (`ClientAlgorithm`: its local loss, what it sends and what
it keeps) and a server side (`ServerAlgorithm`: what it sends each party and what it does with the
uploads), on the bases of base.py; the registry maps their names to them."""
