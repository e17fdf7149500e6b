"""The data side: cache URLs, the cache reader, benchmark campaigns, image checks."""
