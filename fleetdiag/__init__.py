"""fleetdiag: why is each GPU node in the fleet broken?"""

__version__ = "0.1.0"
