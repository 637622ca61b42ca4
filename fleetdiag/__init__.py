"""fleetdiag: why is each GPU node in the fleet broken?"""

import warnings

__version__ = "0.1.0"

# cryptography warns, as asyncssh is imported, that an algorithm asyncssh supports (DSA, since cryptography 51) is
# deprecated: a notice about the library's code for its maintainers, printed whether or not any key uses it, that
# would open every command's output (the demo's, a cron sweep's mail) with a dozen lines about nothing on a host.
warnings.filterwarnings("ignore", message=r".* is deprecated and support will be removed", module=r"asyncssh(?:\.|$)")
