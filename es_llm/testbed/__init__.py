"""The embedded testbed: small base models built deterministically on this machine."""
