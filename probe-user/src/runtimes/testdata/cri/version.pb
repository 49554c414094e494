
0.1.0
containerd
1.6.20~ds1"v1