#!/bin/sh
# Exits 1 after a lot of stderr and no stdout (the message must keep only the tail).
i=0
while [ $i -lt 2000 ]; do echo "noise line $i"; i=$((i+1)); done >&2
echo "the real reason" >&2
exit 1
