"""The SSH side: options and outcomes (reach), connections (transport, sshfast), kept connections
(keeper), and the fanout over a fleet (scheduler, spread)."""
