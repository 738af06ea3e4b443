"""Object storage: the ObjectStore interface and its backends (store.py, local_store.py, s3_store.py), every object
key format (keys.py), the block object's bytes (block_format.py), and the parts that move data to and from the
bucket. Nothing here talks to a boto client except s3_store.py."""
