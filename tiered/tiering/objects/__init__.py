"""Object storage: the ObjectStore interface and its backends (store, local_store, s3_store), every object key
format (keys), the topic objects, and the deadline-and-retry wrapper every store call goes through (retrying).
Nothing in tiered talks to a boto client except s3_store."""
