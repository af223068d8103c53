"""Lost and doubled replies, pauses, suspends, kills, skewed clocks, failovers, volume."""
