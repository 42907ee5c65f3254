"""Exercise 14, a solution: rank 1 receives first wherever the two ranks exchange."""
PROGRAM = [
    ["F0", "sendF0>1", "F1", "sendF1>1", "recvB0<1", "B0", "F2", "sendF2>1", "recvB1<1", "B1", "F3", "sendF3>1",
     "recvB2<1", "B2", "recvB3<1", "B3"],
    ["recvF0<0", "F0", "B0", "recvF1<0", "sendB0>0", "F1", "B1", "recvF2<0", "sendB1>0", "F2", "B2", "recvF3<0",
     "sendB2>0", "F3", "B3", "sendB3>0"],
]
