#!/bin/sh
# Prints the signal dispositions and mask it was started with.
exec grep -E '^Sig(Ign|Blk):' /proc/self/status
