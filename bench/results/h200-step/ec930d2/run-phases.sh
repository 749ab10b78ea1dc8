source bench/results/h200-step/overlap/env.sh
export B=$b
nvidia-smi -L > $o/gpu.txt
MODES=gpt2 N=1000 timeout 150 python3 bench/results/h200-step/python-client/trainloop.py > $o/phases.txt 2>&1; echo "rc=$?" >> $o/phases.txt
PHASES=0 PROFILE=1 MODES=gpt2 N=1000 timeout 150 python3 bench/results/h200-step/python-client/trainloop.py > $o/profile.txt 2>&1; echo "rc=$?" >> $o/profile.txt
cd $OUT && tar czf r.tgz r && rm -rf r
