//! A checkpoint of the MNIST loop served over HTTP by nimbus Serve, as the
//! `serve_mnist` example does: the replicas' answers are the checkpoint's
//! own predictions here, batched or not.

use std::time::Duration;

use nimbus_serve::{Application, HttpOptions, Serve};
use nimbus_train::ScalingConfig;

use crate::serve_mnist::{test_digits, MnistCnn, Prediction};
use crate::tests::{fit, ok, run_config, small};

/// One HTTP answer: status and body.
fn post(url: &str, body: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let mut answer = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.body_mut().read_to_string().unwrap())
}

pub async fn a_trained_checkpoint_is_served_over_http_in_batches(_: &mut nimbus::Driver) {
    let (result, _) = fit(small(20), ScalingConfig::workers(2), run_config("served")).await;
    ok(&result);
    let checkpoint = result.checkpoint.expect("a checkpoint").path;
    let local = MnistCnn::load(&checkpoint).unwrap();
    let serve = Serve::start(HttpOptions::default().port(0)).await.unwrap();
    let app = Application::new::<MnistCnn>(checkpoint.clone())
        .unwrap()
        .route_prefix("/mnist")
        .num_replicas(2)
        .num_cpus(0.5)
        .max_ongoing_requests(8)
        .batching(8, Duration::from_millis(20));
    serve.run(app).await.unwrap();
    let url = format!("http://{}/mnist", serve.addresses()[0]);

    // 48 digits from 8 clients at once: batches form on busy replicas.
    let (images, _) = test_digits(48, 5);
    let expected = local.predict(&images);
    let (client_url, client_images) = (url.clone(), images.clone());
    let served: Vec<(u16, String)> = tokio::task::spawn_blocking(move || {
        std::thread::scope(|scope| {
            let clients: Vec<_> = client_images
                .chunks(6)
                .map(|chunk| {
                    let url = &client_url;
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|image| post(url, &serde_json::to_string(image).unwrap()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            clients
                .into_iter()
                .flat_map(|client| client.join().unwrap())
                .collect()
        })
    })
    .await
    .unwrap();
    for (i, ((status, body), here)) in served.iter().zip(&expected).enumerate() {
        assert_eq!(*status, 200, "image {i}: {body}");
        let answer: Prediction = serde_json::from_str(body).unwrap();
        assert_eq!(
            answer.digit, here.digit,
            "image {i}: served {answer:?}, here {here:?}"
        );
        assert!(
            (answer.probability - here.probability).abs() < 1e-4,
            "image {i}: served {answer:?}, here {here:?}"
        );
    }

    // A wrong shape and a body that is not JSON: 400, saying what is wrong.
    let (url_a, url_b) = (url.clone(), url.clone());
    let (status, body) = tokio::task::spawn_blocking(move || post(&url_a, "[0.5, 0.5]"))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("784 pixel intensities") && body.contains("got 2"),
        "{body}"
    );
    let (status, body) = tokio::task::spawn_blocking(move || post(&url_b, "[0.5,"))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");

    // A checkpoint that is not there fails the deploy, naming it.
    let missing = checkpoint.with_file_name("checkpoint_999999999");
    let app = Application::new::<MnistCnn>(missing.clone())
        .unwrap()
        .name("missing")
        .route_prefix("/missing")
        .num_cpus(0.5);
    let error = serve
        .run(app)
        .await
        .expect_err("no checkpoint there")
        .to_string();
    assert!(
        error.contains("cannot load the MNIST CNN") && error.contains("checkpoint_999999999"),
        "{error}"
    );
    serve.shutdown().await.unwrap();
}
