"""`cutpoint-lab`: the test bed's own command (see main.py)."""
