"""What callers use: run_exclusive, lock(), @exclusive on functions and views, unique_on,
Leadership, the skip report, asyncio."""
