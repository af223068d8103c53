"""Each storage (SQLite, PostgreSQL, MariaDB, Redis single, Sentinel and Cluster, memory), and the
contract suite on every backend, with its mutants."""
