#!/bin/sh
# Reward 1 when /app/answer.txt says hello, else 0 (Harbor reads /logs/verifier/reward.txt).
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null | tr -d '[:space:]')" = "hello" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
