"""A team's own Parquet data: the files (`files`), their schema against the declared columns
(`schema`), reading row groups (`reader`), making batches (`batches`), the string hash (`hashing`) and
the batch source (`source`)."""
