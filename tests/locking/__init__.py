"""One lock: options, keys, waiting, transactions, acting on a loss, the fast path."""
