"""`dpsql serve`: a PostgreSQL-protocol server in front of private sessions (see server.py), on the standard
library only: protocol.py frames messages, scram.py logs analysts in, users.py keeps their verifiers, types.py
maps dpsql's types to PostgreSQL's, commands.py answers SET, SHOW and the like without touching the data."""
